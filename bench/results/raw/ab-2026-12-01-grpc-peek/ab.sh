#!/bin/bash
# A/B: base = tvmsched/serve/grpc_server.py as of 0fe42aa (the model name read by an engine call), new =
# the commit after it (read from the message's first bytes), alternating. args: rounds requests artifacts...
R=$1; N=$2; shift 2
cd /work/main
for i in 1 2 3; do for v in base new; do
  [ $v = base ] && git checkout -q 0fe42aa -- tvmsched/serve/grpc_server.py
  echo "== $v $(cut -d' ' -f1 /proc/loadavg)"
  timeout 900 .venv/bin/python bench/cpp_server_overhead.py "$@" --rounds $R --requests $N 2>&1 | grep "^|\|rror" | grep -v "^|---\|direct\|^| model"
  [ $v = base ] && git checkout -q HEAD -- tvmsched/serve/grpc_server.py
done; done
git status --short | wc -l
