#!/usr/bin/env bash
# Prepare the GPU suite here (where the TVM compiler is), then run it on a GPU machine with one call.
#   bash bench/gpu/prepare.sh [--no-kit] [prepare.py options: --models ... --db URL --tuned MODEL=ARTIFACT]
# Builds the runtime kit (.devkit/, bench/gpu/make-kit.sh) unless --no-kit, compiles the suite's models
# for CUDA and writes their slim artifacts and .gpu/suite.json (bench/gpu/prepare.py), printing every
# size. Then, on the GPU machine: carry [".devkit", ".gpu"], command "bash bench/gpu/suite.sh".
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then source .venv/bin/activate; fi
kit=1
if [ "${1:-}" = --no-kit ]; then kit=; shift; fi
if [ -n "$kit" ]; then bash bench/gpu/make-kit.sh; fi
python bench/gpu/prepare.py "$@"
