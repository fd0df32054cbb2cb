#!/usr/bin/env bash
# A/B on CPU: the engine before issue 30 (deadddb^ = a462f24, /tmp/base30) and HEAD, alternating, same artifacts
set -u
PY=/work/main/.venv/bin/python
for round in 1 2 3; do
  for side in base head; do
    if [ $side = base ]; then dir=/tmp/base30; pp=/tmp/base30; else dir=/work/main; pp=; fi
    (cd $dir && PYTHONPATH=$pp $PY -P bench/preemption.py --device cpu --artifact-dir /tmp/share_cpu --sections latency mix \
       --samples 60 --mix-seconds 3 --loads 0.2 0.5 0.8 --realtime resnet18-small --best-effort bert-tiny \
       --out /tmp/ab30/pre-$side-$round.json > /tmp/ab30/pre-$side-$round.log 2>&1)
    echo "$side $round $?"
  done
done
