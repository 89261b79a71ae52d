#!/bin/bash
# Call 86 (session 20): the rows GEMM's fold (the last block of an n-block summing the partials) issues the loads
# of all its outputs together, four partials of each at a time; the adds and their order are unchanged.
# 1. rows_gemm_variants.py against the source before the session (.device/prev_gemm.cu): bitwise equality and
#    time on every call of a verify at 8 and 16 rows;
# 2. rows_gemm_timeline.py (ELPIS_GEMM_CLOCKS) on the MLP shapes, 16 rows, to compare with call 85;
# 3. GPU tests of the kernel.
# Staged, not run (no machine could be started). The change is reverted on main until this call measures it:
# first `git checkout f1f92ae -- patches/kernels/exl3_gemm_rows.cu`. No `make build` on the device: run with
# run(carry=[".whl", ".device", "build/kernels"]).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
echo "=== rows GEMM: batched fold ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 240 python3 elpis/bench/scripts/rows_gemm_variants.py .device/prev_gemm.cu "$OUT/variants.json" \
  served= 2>&1 | tail -18 | tee -a "$OUT/log"
echo "=== rows GEMM timeline ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 120 python3 elpis/bench/scripts/rows_gemm_timeline.py "$OUT/timeline.json" 2>&1 | grep -v late_blocks \
  | cut -c1-330 | tail -9 | tee -a "$OUT/log"
gpu_pytest "rows GEMM kernel" $(( $(left) - 15 )) tests/kernels/test_rows_gemm.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
