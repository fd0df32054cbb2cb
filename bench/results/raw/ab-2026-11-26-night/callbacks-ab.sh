#!/usr/bin/env bash
set -u
PY=/work/main/.venv/bin/python
for round in 1 2; do
  for side in base head; do
    if [ $side = base ]; then pp=/tmp/base31; else pp=; fi
    (cd /work/main && PYTHONPATH=$pp $PY -P bench/callbacks.py --rounds 3 --requests 200 --hogs 1 --label $side \
       --out /tmp/ab31/cb-$side-$round.json > /tmp/ab31/cb-$side-$round.log 2>&1)
    echo "cb $side $round $?"
  done
done
