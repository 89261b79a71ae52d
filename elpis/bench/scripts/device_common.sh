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
# A fresh machine's first steps: the GPU line in the log, `elpis build` in the background and the full-size
# synthetic checkpoints (/tmp/full/{target,draft}) beside it; wait_build / wait_synth join them.
start_build_and_full_synth() {
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
  export ELPIS_PROVE_JOBS=${ELPIS_PROVE_JOBS:-14}
  ( time python3 -m elpis.cli build ) >/tmp/build.log 2>&1 &
  BUILD=$!
  ( python3 -m elpis.cli synth --full /tmp/full/target && python3 -m elpis.cli synth --draft /tmp/full/draft ) \
    >/tmp/synth_full.log 2>&1 &
  SYNTH=$!
}
wait_build() { wait "$BUILD"; tail -3 /tmp/build.log | tee -a "$OUT/log"; }
# The same with the small synthetic model (/tmp/small) made beside the build; returns once both are done (a
# failed build ends the script).
build_and_small_synth() {
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
  ( ELPIS_PROVE_JOBS=${ELPIS_PROVE_JOBS:-14} python3 -m elpis.cli build ) > /tmp/build.log 2>&1 &
  BUILD=$!
  timeout -k 2 60 python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1 | tee -a "$OUT/log"
  wait $BUILD || { tail -20 /tmp/build.log | tee -a "$OUT/log"; exit 1; }
  tail -2 /tmp/build.log | tee -a "$OUT/log"
}
wait_synth() { wait "$SYNTH"; tail -1 /tmp/synth_full.log | tee -a "$OUT/log"; }
part() {  # name: run one part's script (each bounds itself by `left`)
  echo "=== $1 ($(left) s left)" | tee -a "$OUT/log"
  ( source "elpis/bench/scripts/device_part_$1.sh" ) 2>&1 | tail -30
}
# gpu_pytest TITLE LIMIT ARGS...: one `pytest -m gpu` run of at most LIMIT s, its output appended to
# $OUT/pytest.txt, the tests' JSON lines (ELPIS_KERNEL_LOG / ELPIS_TREE_LOG) and its outcome in the log.
gpu_pytest() {
  local title=$1 limit=$2 rc
  shift 2
  echo "=== $title ($(left) s left)" | tee -a "$OUT/log"
  ELPIS_KERNEL_LOG="$OUT/log" ELPIS_TREE_LOG="$OUT/log" timeout -k 3 "$limit" python3 -m pytest -m gpu -q \
    -p no:cacheprovider -rfEs --tb=short "$@" >> "$OUT/pytest.txt" 2>&1
  rc=$?
  echo "$title: exit $rc" | tee -a "$OUT/log"
  tail -40 "$OUT/pytest.txt" | grep -E "passed|failed|^FAILED|^E |\"24gib\"" | tail -8 | tee -a "$OUT/log"
}
# At most 8 files come back from $OUT (2 folders deep): past that, everything but the log goes back as one
# archive, $OUT/out.tar (session 12's call 47 lost six files to the limit).
pack_outputs() {
  local count
  count=$(find "$OUT" -type f | wc -l)
  if [ "$count" -gt 8 ]; then
    ( cd "$OUT" && find . -type f ! -name log ! -name out.tar -print0 | tar --null -cf out.tar -T - --remove-files )
    echo "packed $count files into out.tar" | tee -a "$OUT/log"
  fi
}
