#!/bin/bash
# Call 88 (session 21): the rows GEMM's fold. Call 87's clocks put 4.4 us (one partial) to 8.4 us (about seven) of a
# lone projection's tail in the last block's sum of the partials; its SASS showed why: each `ld.cg` (a strong
# load) sat right before its own add, one L2 round trip per partial. Knobs, all bit-exact:
#   ELPIS_GEMM_FOLD 1 / 2       all of a thread's partial loads issued before the adds (volatile asm), 1: ld.cg,
#                               2: plain loads after the acquiring fence;
#   ELPIS_GEMM_FENCE_ACQREL     fence.acq_rel.gpu instead of __threadfence (fence.sc.gpu);
#   ELPIS_GEMM_RELEASE          one fence by thread 0 after the barrier instead of one per thread.
# 1. rows_gemm_variants.py against the source before session 20 (.device/prev_gemm.cu): bitwise and time;
# 2. rows_gemm_timeline.py, knobs off and FOLD 2; 3. GPU tests of the kernel (served knobs).
# No `make build` on the device: carry [".whl", ".device", "build/kernels"].
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
echo "=== rows GEMM: fold knobs ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 300 python3 elpis/bench/scripts/rows_gemm_variants.py .device/prev_gemm.cu "$OUT/variants.json" \
  served= fold1=ELPIS_GEMM_FOLD:1 fold2=ELPIS_GEMM_FOLD:2 acqrel=ELPIS_GEMM_FOLD:2,ELPIS_GEMM_FENCE_ACQREL:1 \
  release=ELPIS_GEMM_FOLD:2,ELPIS_GEMM_FENCE_ACQREL:1,ELPIS_GEMM_RELEASE:1 2>&1 | tail -18 | tee -a "$OUT/log"
for knobs in "" "ELPIS_GEMM_FOLD:2"; do
  echo "=== rows GEMM timeline [$knobs] ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 5 120 python3 elpis/bench/scripts/rows_gemm_timeline.py "$OUT/timeline${knobs:+-fold2}.json" "$knobs" 2>&1 \
    | grep -v late_blocks | cut -c1-700 | tail -9 | tee -a "$OUT/log"
done
gpu_pytest "rows GEMM kernel" $(( $(left) - 15 )) tests/kernels/test_rows_gemm.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
