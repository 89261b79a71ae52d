#!/bin/bash
# Call 91 (session 21): with the batched fold served (calls 88-90), the 16-row MLP gate/up call is 2.6 us slower
# than before it while every other call is faster; the main loop's code is the same work, scheduled differently.
# Same-order variants that change the code around it: partials per round of the fold's loads
# (ELPIS_GEMM_FOLD_BATCH 2 / 8, served 4) and k-tiles of words in flight per warp (ELPIS_GEMM_STAGES 2 / 4,
# served 3), the served source twice (noise reference). rows_gemm_variants.py against .device/prev_gemm.cu.
# No `make build` on the device: carry [".whl", ".device", "build/kernels"].
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
echo "=== rows GEMM: fold batch and stages ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 300 python3 elpis/bench/scripts/rows_gemm_variants.py .device/prev_gemm.cu "$OUT/variants.json" \
  served= b2=ELPIS_GEMM_FOLD_BATCH:2 b8=ELPIS_GEMM_FOLD_BATCH:8 st2=ELPIS_GEMM_STAGES:2 st4=ELPIS_GEMM_STAGES:4 \
  served2= 2>&1 | tail -18 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
