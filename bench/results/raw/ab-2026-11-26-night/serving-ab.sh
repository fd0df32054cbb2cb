#!/usr/bin/env bash
set -u
PY=/work/main/.venv/bin/python
for round in 1 2; do
  for side in base head; do
    if [ $side = base ]; then pp=/tmp/base31; else pp=; fi
    (cd /work/main && PYTHONPATH=$pp timeout 900 $PY -P bench/serving.py --seconds 1 --port $((18600 + round * 10)) \
       --out /tmp/ab31/serve-$side-$round.md > /tmp/ab31/serve-$side-$round.log 2>&1)
    echo "serve $side $round $?"
  done
done
