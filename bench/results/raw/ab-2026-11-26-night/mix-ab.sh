#!/usr/bin/env bash
# A/B on CPU: the package before the preemption group (8025d7f, /tmp/base31) and HEAD, alternating, same artifacts,
# the same (HEAD's) bench script
set -u
PY=/work/main/.venv/bin/python
for round in 1 2 3 4; do
  for side in base head; do
    if [ $side = base ]; then pp=/tmp/base31; else pp=; fi
    (cd /work/main && PYTHONPATH=$pp $PY -P bench/preemption.py --device cpu --artifact-dir /tmp/share_cpu --sections mix \
       --mix-seconds 4 --loads 0.2 0.5 --realtime resnet18-small --best-effort bert-tiny \
       --out /tmp/ab31/pre-$side-$round.json > /tmp/ab31/pre-$side-$round.log 2>&1)
    echo "$side $round $?"
  done
done
