#!/bin/bash
# Call 85 (session 20): the rows GEMM's losses found by call 84.
# 1. rows_gemm_variants.py: the shared-memory pipeline (ELPIS_GEMM_ASYNC, cp.async rings of 4 or 3 slots a warp)
#    against the served register pipeline (.device/prev_gemm.cu, the source before this session) on every
#    call of a verify at 8 and 16 rows: bitwise equality, time per call and per verify.
# 2. rows_gemm_timeline.py: the served build's block timeline (ELPIS_GEMM_CLOCKS) on the MLP shapes, 16 rows.
# 3. GPU tests of the kernel (served build).
# No `make build` on the device: run with run(carry=[".whl", ".device", "build/kernels"]).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
echo "=== rows GEMM: shared-memory pipeline ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 240 python3 elpis/bench/scripts/rows_gemm_variants.py .device/prev_gemm.cu "$OUT/variants.json" \
  served= async=ELPIS_GEMM_ASYNC:1 async3=ELPIS_GEMM_ASYNC:1,ELPIS_GEMM_ASYNC_STAGES:3,ELPIS_GEMM_ASYNC_STAGES6:2 \
  2>&1 | tail -20 | tee -a "$OUT/log"
echo "=== rows GEMM timeline ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 120 python3 elpis/bench/scripts/rows_gemm_timeline.py "$OUT/timeline.json" 2>&1 | cut -c1-700 \
  | tail -14 | tee -a "$OUT/log"
gpu_pytest "rows GEMM kernel" $(( $(left) - 15 )) tests/kernels/test_rows_gemm.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
