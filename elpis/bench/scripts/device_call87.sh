#!/bin/bash
# Call 87 (session 21): the rows GEMM's epilogue, where a lone projection's launch idles (call 85's timeline).
# Four bit-exact changes, each a compile-time knob here so one run times them side by side:
#   ELPIS_GEMM_SVH_EARLY     the lane's output scales loaded before the partials go out, not after the fold;
#   ELPIS_GEMM_RELEASE       one fence by thread 0 after the barrier instead of one per thread (release/acquire);
#   ELPIS_GEMM_PACKED_STORE  four outputs per lane in one 8- or 16-byte store;
#   ELPIS_GEMM_FINISH_PAIRS  rows warp and warp + 8 transformed together.
# 1. rows_gemm_variants.py against the source before session 20 (.device/prev_gemm.cu): bitwise and time;
# 2. rows_gemm_timeline.py with the new per-phase clocks of the last block's fold, knobs off and all on;
# 3. GPU tests of the kernel. No `make build` on the device: carry [".whl", ".device", "build/kernels"].
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
ALL=ELPIS_GEMM_SVH_EARLY:1,ELPIS_GEMM_RELEASE:1,ELPIS_GEMM_PACKED_STORE:1,ELPIS_GEMM_FINISH_PAIRS:1
echo "=== rows GEMM: epilogue knobs ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 300 python3 elpis/bench/scripts/rows_gemm_variants.py .device/prev_gemm.cu "$OUT/variants.json" \
  served= svh=ELPIS_GEMM_SVH_EARLY:1 rel=ELPIS_GEMM_RELEASE:1 st=ELPIS_GEMM_PACKED_STORE:1 \
  pairs=ELPIS_GEMM_FINISH_PAIRS:1 all=$ALL 2>&1 | tail -18 | tee -a "$OUT/log"
for knobs in "" "$ALL"; do
  echo "=== rows GEMM timeline [$knobs] ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 5 120 python3 elpis/bench/scripts/rows_gemm_timeline.py "$OUT/timeline${knobs:+-all}.json" "$knobs" 2>&1 \
    | grep -v late_blocks | cut -c1-600 | tail -9 | tee -a "$OUT/log"
done
gpu_pytest "rows GEMM kernel" $(( $(left) - 15 )) tests/kernels/test_rows_gemm.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
