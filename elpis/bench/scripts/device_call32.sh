#!/bin/bash
# Calls 32-34 (issue 9): elpis's EXL3 GEMM for 1-16 rows (patches/kernels/exl3_gemm_rows.cu) against ExLlamaV3's
# on every Qwen3.8 linear shape: the GPU tests of the kernel (decode bit for bit ExLlamaV3's, error against fp64
# at most ExLlamaV3's, rows invariant), elpis/bench/scripts/rows_gemm_check.py (per shape and row count: time in
# CUDA graphs beside ExLlamaV3's, error against fp64, invariance; for 2, 3 and 4 k-tiles in flight per warp),
# and Nsight Compute on the MLP gate shape at 8 rows. Run with run(carry=[".whl", ".device"]); ~1 min.
LIMIT=${LIMIT:-540}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
( ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build ) > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log | tee -a "$OUT/log"; exit 1; }
gpu_pytest "rows GEMM kernel tests" 200 tests/kernels/test_rows_gemm.py
for st in 2 3 4; do
  echo "=== check, $st k-tiles in flight ($(left) s left)" | tee -a "$OUT/log"
  timeout 150 python3 elpis/bench/scripts/rows_gemm_check.py "$OUT/rows_gemm_s$st.json" $st 2>&1 | tail -22 | tee -a "$OUT/log"
done
echo "=== ncu ($(left) s left)" | tee -a "$OUT/log"
timeout 90 ncu --clock-control none --nvtx --nvtx-include "gemm/" --launch-count 3 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section InstructionStats --section SchedulerStats \
    python3 elpis/bench/scripts/rows_gemm_ncu.py 5120 17408 8 > "$OUT/ncu_gate8.txt" 2>&1
grep -E "rows_gemm_kernel|exl3_gemm_kernel|Duration|Issue Slots Busy|Achieved Occupancy|Executed Instructions  |DRAM Throughput|Eligible" "$OUT/ncu_gate8.txt" | head -40 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
