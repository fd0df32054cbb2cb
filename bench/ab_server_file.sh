#!/bin/bash
# A/B of one file of tvmsched/serve: `base` is FILE as of commit BASE, `new` the working tree's, alternating, three runs
# each, through bench/cpp_server_overhead.py (inside the server, per model and way; bench/results/serving.md).
#   bash bench/ab_server_file.sh FILE BASE ROUNDS REQUESTS ARTIFACT...
FILE=$1; BASE=$2; R=$3; N=$4; shift 4
cd "$(dirname "$0")/.."
for i in 1 2 3; do for v in base new; do
  [ $v = base ] && git checkout -q "$BASE" -- "$FILE"
  echo "== $v $(cut -d' ' -f1 /proc/loadavg)"
  timeout 900 .venv/bin/python bench/cpp_server_overhead.py "$@" --rounds "$R" --requests "$N" 2>&1 | grep "^|\|rror" | grep -v "^|---\|direct\|^| model"
  [ $v = base ] && git checkout -q HEAD -- "$FILE"
done; done
git status --short -- "$FILE" | wc -l  # 0: FILE is the working tree's again
