#!/bin/bash
# A/B: base = 377c56c's tvmsched/serve + its engine library (/tmp/x/ab/base), new = the working tree + its library
# (/tmp/x/ab/new), alternating. args: rounds requests artifacts...
export TVMSCHED_TVM_LIBDIR=/work/main/.venv/lib/python3.11/site-packages/tvm/lib
R=$1; N=$2; shift 2
cd /work/main
for i in 1 2; do for v in base new; do
  [ $v = base ] && git checkout -q 377c56c -- tvmsched/serve
  echo "== $v $(cut -d' ' -f1 /proc/loadavg)"
  LD_LIBRARY_PATH=/tmp/x/ab/$v TVMSCHED_ENGINE_LIB=/tmp/x/ab/$v/libtvmsched_engine.so timeout 600 .venv/bin/python bench/cpp_server_overhead.py "$@" --rounds $R --requests $N 2>&1 | grep "^|\|rror" | grep -v "^|---\|direct\|^| model"
  [ $v = base ] && git checkout -q HEAD -- tvmsched/serve
done; done
git status --short | wc -l
