# Shared setup for runs on the lent GPU machine (sourced by the device_*.sh scripts).
# Installs the carried wheels, puts a carried prebuilt exllamav3 extension and acceptor in place, points
# Triton and the EXL3 autotuner at caches that come back through $OUT.
set -u
export PYTHONUNBUFFERED=1
T0=${T0:-$(date +%s)}
left() { echo $(( ${LIMIT:-590} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
export TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 TORCH_EXTENSIONS_DIR=/tmp/torch_ext
export TRITON_CACHE_DIR=/tmp/triton EXLLAMAV3_TUNE_CACHE=/tmp/tune/coop_autotune_v1.bin
mkdir -p /tmp/tune /tmp/triton "$OUT"
if ls .device/ext.so.xz.part-* >/dev/null 2>&1; then
  mkdir -p /tmp/extmod && cat .device/ext.so.xz.part-* | xz -d > /tmp/extmod/exllamav3_ext.so
  export PYTHONPATH=/tmp/extmod:$PYTHONPATH
fi
if ls .device/caches.tar.xz.part-* >/dev/null 2>&1; then cat .device/caches.tar.xz.part-* | tar -C /tmp -xJf -; fi
if [ -d .device/accept-cp312 ]; then mkdir -p build && rm -rf build/accept && cp -r .device/accept-cp312 build/accept; fi
save_caches() { rm -f "$OUT"/caches.tar.xz.part-*; tar -C /tmp -cf - triton tune 2>/dev/null | xz -T16 -1 | split -b 15M - "$OUT/caches.tar.xz.part-"; ls -la "$OUT"; }
