#!/usr/bin/env bash
# The GPU suite in one command, on a GPU machine without the TVM compiler (docs/gpu.md):
#   device call: carry [".devkit", ".gpu"] (made here by bash bench/gpu/prepare.sh), command "bash bench/gpu/suite.sh"
# Installs the kit, restores every carried artifact, checks it against onnxruntime, times tvmsched against
# PyTorch eager, eager + CUDA graph and torch.compile on PyTorch twins of the same models, reads per-kernel
# GPU time with CUPTI (torch.profiler) and writes bench/results/gpu.md (+ raw JSON), copied to $OUT when set.
# Then the sharing sections (bench/gpu/sharing.sh: preemption mix, switching, tiering, colocation) on the restored
# artifacts, within SHARING_S seconds (default 120; 0 skips them), written to bench/results/gpu-sharing.md.
# Everything stays within SUITE_BUDGET_S seconds (default 420: 7 minutes). Extra arguments go to suite.py
# (--models NAME..., --compile-backend none, --repeat N, ...).
set -uo pipefail
start=$SECONDS
cd "$(dirname "$0")/../.."
if [ ! -f .devkit/activate.sh ] || [ ! -f .gpu/suite.json ]; then
  echo "error: .devkit/ or .gpu/suite.json is missing: run 'bash bench/gpu/prepare.sh' where TVM is and carry [\".devkit\", \".gpu\"]" >&2
  exit 2
fi
source .devkit/activate.sh || { echo "error: installing the kit failed" >&2; exit 2; }
export TVM_FFI_DISABLE_TORCH_C_DLPACK=1 PYTHONUNBUFFERED=1
budget=${SUITE_BUDGET_S:-420}
sharing=${SHARING_S:-120}
left=$(( budget - (SECONDS - start) - 10 - sharing ))
work=${TMPDIR:-/tmp}/gpu-suite-$(id -u)
copy=()
if [ -n "${OUT:-}" ]; then copy=(--copy-to "$OUT"); fi
python3 -P bench/gpu/suite.py --artifacts .gpu --work "$work" --out bench/results/gpu.md --budget-s "$left" "${copy[@]}" "$@"
rc=$?
if (( sharing > 0 )); then
  bash bench/gpu/sharing.sh "$work" cuda $(( budget - (SECONDS - start) - 5 ))
fi
echo "suite: ${rc} after $(( SECONDS - start )) s (kit install included)"
exit $rc
