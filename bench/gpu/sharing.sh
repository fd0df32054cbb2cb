#!/usr/bin/env bash
# The sharing sections of the GPU suite (issue 30), run by suite.sh after the kernel suite on the artifacts it
# restored: the real-time + best-effort mix (bench/preemption.py), switching (tvmsched bench switch), tiering at 1/2
# and 1/4 of a model's footprint with its copy floor (bench/tiering.py) and the colocation policies
# (bench/colocation.py). Each section is bounded; all of them stay within BUDGET seconds. The raw output of each goes
# to bench/results/raw/sharing-*.json and a summary to bench/results/gpu-sharing.md (both copied to $OUT when set).
#   bash bench/gpu/sharing.sh WORK [DEVICE=cuda] [BUDGET=120]
# On this machine, the same sections on CPU artifacts: bash bench/gpu/sharing.sh DIR cpu 120 (DIR holding
# mlp.tvms, resnet18-small.tvms, bert-tiny.tvms, resnet18.tvms, compiled for llvm).
set -uo pipefail
cd "$(dirname "$0")/../.."
work=${1:?usage: sharing.sh WORK [DEVICE] [BUDGET_S]}
device=${2:-cuda}
budget=${3:-120}
start=$SECONDS
raw=bench/results/raw
report=bench/results/$([ "$device" = cuda ] && echo gpu-sharing || echo "sharing-$device").md
mkdir -p "$raw"
{
  echo "# Sharing on one $device device ($(date -u +%F), $(hostname))"
  echo
  echo "Written by bench/gpu/sharing.sh WORK $device $budget; artifacts from $work. Each section: its command, the"
  echo "last lines it printed, its exit status (124: stopped at its time share)."
} > "$report"

# section NAME SECONDS COMMAND...: run it within its share of what is left
section() {
  local name=$1 share=$2 left
  shift 2
  left=$(( budget - (SECONDS - start) ))
  {
    echo
    echo "## $name"
    if (( left < 10 )); then
      echo "skipped: the time budget is spent"
      return
    fi
    (( share > left )) && share=$left
    echo '```'
    echo "\$ $*"
    timeout -k 5 "$share" "$@" 2>&1 | tail -25
    echo "exit ${PIPESTATUS[0]}"
    echo '```'
  } >> "$report"
}

have() { for m in "$@"; do [ -f "$work/$m.tvms" ] || return 1; done; }
# SHARING_SECTIONS: which sections run (default all): preemption rtstreams loops loopmix switching tiering colocation
want() { [[ " ${SHARING_SECTIONS:-preemption rtstreams loops loopmix switching tiering colocation} " == *" $1 "* ]]; }

if have resnet18-small bert-tiny && want preemption; then
  section "preemption: real-time resnet18-small, best-effort bert-tiny" 40 \
    python3 -P bench/preemption.py --device "$device" --artifact-dir "$work" --sections mix --mix-seconds 3 \
      --loads 0.2 0.5 0.8 --realtime resnet18-small --best-effort bert-tiny --out "$raw/sharing-preemption-$device.json"
fi
if have resnet18-small bert-tiny && want rtstreams; then  # Runtime.load(streams=2): two copies of the real-time model
  section "preemption, the real-time model on two streams: the same mix" 40 \
    python3 -P bench/preemption.py --device "$device" --artifact-dir "$work" --sections mix --mix-seconds 3 \
      --loads 0.2 0.5 0.8 --realtime resnet18-small --best-effort bert-tiny --rt-streams 2 \
      --out "$raw/sharing-preemption-2streams-$device.json"
fi
# --loop-checks K (prepare.py --variant; docs/gpu.md): their flag in device memory (the engine's choice for them);
# block-start checks' latency with the flag in host-mapped memory (auto there), then in device memory
if have resnet18-small bert-tiny resnet18-small.loops bert-tiny.loops; then
  loops=$(mktemp -d)  # MODEL.tvms: with loop checks; MODEL.plain.tvms: block-start checks only (the default)
  for m in resnet18-small bert-tiny; do
    ln -s "$(realpath "$work/$m.loops.tvms")" "$loops/$m.tvms"
    ln -s "$(realpath "$work/$m.tvms")" "$loops/$m.plain.tvms"
  done
  # the latency section's real-time probe (realtime_delay: what preemption costs a real-time request)
  [ -f "$work/mlp.tvms" ] && ln -s "$(realpath "$work/mlp.tvms")" "$loops/mlp.tvms"
  want loops && section "loop checks: latency against block-start checks (plain), preempt() latency of each" 55 \
    bash -c "python3 -P bench/preemption.py --device $device --artifact-dir $loops --sections overhead \
      --models resnet18-small bert-tiny --rounds 4 --repeat 25 --out $raw/sharing-loops-overhead-$device.json &&
      python3 -P bench/preemption.py --device $device --artifact-dir $work --sections latency --samples 90 \
      --out $raw/sharing-latency-$device.json | tail -2 &&
      python3 -P bench/preemption.py --device $device --artifact-dir $work --sections latency --samples 90 \
      --flag-memory device --out $raw/sharing-latency-device-flag-$device.json | tail -2 &&
      python3 -P bench/preemption.py --device $device --artifact-dir $loops --sections latency --samples 90 \
      --out $raw/sharing-latency-loops-$device.json | tail -2"
  want loopmix && section "preemption with loop checks (--loop-checks): the same mix" 30 \
    python3 -P bench/preemption.py --device "$device" --artifact-dir "$loops" --sections mix --mix-seconds 3 \
      --loads 0.2 0.5 0.8 --realtime resnet18-small --best-effort bert-tiny --out "$raw/sharing-preemption-loops-$device.json"
fi
if have resnet18-small bert-tiny && want switching; then
  section "switching: resnet18-small and bert-tiny" 25 \
    python3 -P -m tvmsched.cli bench switch "$work/resnet18-small.tvms" "$work/bert-tiny.tvms" --device "$device" --repeat 3
fi
# resnet50 first: at 1/4 of its footprint its largest layer (9.4 MB) still fits twice; resnet18-small's does not
# fit even once beside its activations (the 2026-11-26 H100 run)
tiered=$(ls "$work"/resnet50.tvms "$work"/resnet18.tvms "$work"/resnet18-small.tvms 2>/dev/null | head -1)
if [ -n "$tiered" ] && want tiering; then
  tierwork=$(mktemp -d)
  stem=$(basename "$tiered" .tvms)
  target=$([ "$device" = cuda ] && echo cuda || echo llvm)
  ln -s "$(realpath "$tiered")" "$tierwork/$stem-$target.tvms"
  section "tiering: $stem at 1/2 and 1/4 of its footprint" 30 \
    python3 -P bench/tiering.py --device "$device" --work "$tierwork" --models "$stem" --requests 5 --repeat 2 \
      --out "$raw/sharing-tiering-$device.json"
fi
if have mlp resnet18-small bert-tiny && want colocation; then
  section "colocation: mlp + resnet18-small + bert-tiny, QoS 1/3/3 ms" 40 \
    python3 -P bench/colocation.py --artifacts "$work/mlp.tvms" "$work/resnet18-small.tvms" "$work/bert-tiny.tvms" \
      --qos-ms 1 3 3 --rates 300 1000 2000 --seconds 2 --device "$device" --out "$raw/sharing-colocation-$device.json"
fi
echo "sharing: $(( SECONDS - start )) s" >> "$report"
if [ -n "${OUT:-}" ]; then
  cp "$report" "$OUT/" && cp "$raw"/sharing-*-"$device".json "$OUT/" 2>/dev/null
fi
exit 0
