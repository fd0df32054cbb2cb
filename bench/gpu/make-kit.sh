#!/usr/bin/env bash
# Prepare a GPU-machine kit inside the repo (folder .devkit/, git-ignored): a runtime-only TVM
# (the installed tvm package minus its 259 MB compiler library; ~7 MB packed) and the
# apache-tvm-ffi wheel for the GPU machine's Python 3.12. Carry `.devkit` with the device tool's
# `carry`, and start every device command with:  source .devkit/activate.sh
# Usage (from the repo root, with the project's venv active):  bash bench/gpu/make-kit.sh
#        bash bench/gpu/make-kit.sh --tvm-only DIR   # just DIR/tvm-runtime.tgz (tests unpack it to run without the compiler)
# Project copy of ../shared/device/make-kit.sh: also packs the tvmsched wheel (build/wheelhouse, `make setup`) into
# the kit; unzipped on the GPU machine, it finds its engine (tvmsched/lib) and TVM's runtime (../../tvm/lib) itself.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
kit="$root/.devkit"
tvm_only=
if [ "${1:-}" = --tvm-only ]; then tvm_only=1; kit=${2:?usage: make-kit.sh --tvm-only DIR}; fi
if [ -z "$tvm_only" ]; then
  exclude=$(git -C "$root" rev-parse --path-format=absolute --git-path info/exclude)  # a worktree's .git is a file
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.devkit/' "$exclude" 2>/dev/null || echo '/.devkit/' >> "$exclude"
  rm -rf "$kit"
fi
mkdir -p "$kit/wheels"
# the project's Python (PYTHON, else the repo's .venv, else the one on PATH): CI runs without the venv active
py=${PYTHON:-python}
if [ -z "${PYTHON:-}" ] && [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"; fi
tvm_dir=$("$py" -c 'import os, tvm; print(os.path.dirname(tvm.__file__))')
ffi_ver=$("$py" -c 'import importlib.metadata as m; print(m.version("apache-tvm-ffi"))')
stage=$(mktemp -d)
cp -r "$tvm_dir" "$stage/tvm"
rm -rf "$stage/tvm/lib/libtvm_compiler.so" "$stage/tvm/3rdparty" "$stage/tvm/src" "$stage/tvm/include" "$stage/tvm/web"
find "$stage/tvm" -name __pycache__ -prune -exec rm -rf {} +
tar czf "$kit/tvm-runtime.tgz" -C "$stage" tvm
rm -rf "$stage"
if [ -n "$tvm_only" ]; then rmdir "$kit/wheels" 2>/dev/null || true; exit 0; fi
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$kit/wheels" "apache-tvm-ffi==$ffi_ver"
# the same tvmsched wheel `make setup` built into build/wheelhouse (py3-none-linux_x86_64: the engine does not link
# libpython, so the GPU machine's Python 3.12 takes it); `make wheel` brings it up to date with the checkout first
make -C "$root" -s wheel >/dev/null
cp "$root"/build/wheelhouse/tvmsched-*.whl "$kit/wheels/"
(cd "$kit" && cksum tvm-runtime.tgz wheels/*.whl) > "$kit/stamp"
cat > "$kit/activate.sh" <<'EOS'
# Source at the start of a device command (from the repo root): installs the kit under /tmp/devkit-site,
# again whenever the carried kit differs from the one installed (a warm machine keeps /tmp). The wheels
# are unzipped (all a wheel install does for these), so pip is not needed there.
if [ "$(cat .devkit/stamp)" != "$(cat /tmp/devkit-site/.stamp 2>/dev/null)" ]; then
  rm -rf /tmp/devkit-site && mkdir -p /tmp/devkit-site && tar xzf .devkit/tvm-runtime.tgz -C /tmp/devkit-site &&
  python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
    /tmp/devkit-site .devkit/wheels/*.whl && cp .devkit/stamp /tmp/devkit-site/.stamp
fi
export PYTHONPATH=/tmp/devkit-site:$PWD${PYTHONPATH:+:$PYTHONPATH} TVM_USE_RUNTIME_LIB=1
EOS
du -sh "$kit"; ls -la "$kit" "$kit/wheels"
