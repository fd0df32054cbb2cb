#!/bin/bash
# A/B: base = tvmsched/serve/http.py as of 645e4ce (a REST request counted from before its body is received), new =
# the commit after it (counted once the body is in), alternating. args: rounds requests artifacts...
R=$1; N=$2; shift 2
cd /work/main
for i in 1 2 3; do for v in base new; do
  [ $v = base ] && git checkout -q 645e4ce -- tvmsched/serve/http.py
  echo "== $v $(cut -d' ' -f1 /proc/loadavg)"
  timeout 900 .venv/bin/python bench/cpp_server_overhead.py "$@" --rounds $R --requests $N 2>&1 | grep "^|\|rror" | grep -v "^|---\|direct\|^| model"
  [ $v = base ] && git checkout -q HEAD -- tvmsched/serve/http.py
done; done
git status --short | wc -l
