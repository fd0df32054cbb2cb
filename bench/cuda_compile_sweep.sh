#!/bin/bash
# Every real architecture (tvmsched.models.REAL_MODELS) compiled for CUDA by `tvmsched compile`, at fp32 and fp16, each
# in a process of its own so that nvcc builds a fatbin (a process that imported TVM first embeds the CUDA source
# unbuilt, which hides nvcc's errors: docs/tvm-pitfalls.md). Prints one line per compile; the artifacts are deleted.
#   bash bench/cuda_compile_sweep.sh [MODEL...]        (default: all of them; results in bench/results/gpu_paths.md)
cd "$(dirname "$0")/.."
tvmsched=.venv/bin/tvmsched
python=.venv/bin/python
work=$(mktemp -d /tmp/cuda-sweep-XXXX)
trap 'rm -rf "$work"' EXIT
models=("$@")
[ ${#models[@]} -gt 0 ] || read -r -a models <<< "$($python -c "from tvmsched import models; print(' '.join(models.REAL_MODELS))")"
for m in "${models[@]}"; do
  $tvmsched models build "$m" -o "$work/$m.onnx" > /dev/null 2>&1 || { echo "$m: error: the ONNX build failed"; continue; }
  read -r -a shapes <<< "$($python -c "
from tvmsched import models
s = models.REAL_MODELS['$m'].input_shapes
print(' '.join(f'--input-shape {k}=' + ','.join(map(str, v)) for k, v in dict(s or {}).items()))")"
  for p in fp32 fp16; do
    start=$(date +%s)
    out=$(timeout 600 $tvmsched compile "$work/$m.onnx" --target cuda --precision $p "${shapes[@]}" -o "$work/$m-$p.tvms" 2>&1 | tail -1)
    echo "$m $p ($(( $(date +%s) - start )) s): $out"
    rm -f "$work/$m-$p.tvms"
  done
done
