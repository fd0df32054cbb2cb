#!/bin/bash
# A/B: base = 1edacad's tvmsched/serve, engine library and C++ server (/tmp/x/ab/base), new = 35b93cc's (the engine's
# book of served models, tvmsched/serving.h; /tmp/x/ab/new), alternating. args: rounds requests artifacts...
export TVMSCHED_TVM_LIBDIR=/work/main/.venv/lib/python3.11/site-packages/tvm/lib
R=$1; N=$2; shift 2
cd /work/main
cp build/cpp/tvmsched_server /tmp/x/ab/server.keep
for i in 1 2; do for v in base new; do
  [ $v = base ] && git checkout -q 1edacad -- tvmsched/serve
  cp /tmp/x/ab/$v/tvmsched_server build/cpp/tvmsched_server
  echo "== $v $(cut -d' ' -f1 /proc/loadavg)"
  LD_LIBRARY_PATH=/tmp/x/ab/$v TVMSCHED_ENGINE_LIB=/tmp/x/ab/$v/libtvmsched_engine.so timeout 900 .venv/bin/python bench/cpp_server_overhead.py "$@" --rounds $R --requests $N 2>&1 | grep "^|\|rror" | grep -v "^|---\|direct\|^| model"
  [ $v = base ] && git checkout -q HEAD -- tvmsched/serve
done; done
cp /tmp/x/ab/server.keep build/cpp/tvmsched_server
git status --short | wc -l
