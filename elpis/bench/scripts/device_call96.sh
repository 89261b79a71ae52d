#!/bin/bash
# Call 96 (session 22): the rows GEMM with its input tasks as the checkout serves it, after call 95 picked the
# wait and the fragment load: its timeline, GPU tests (kernel with the repeated and crowded calls, and the patch in
# the engine) and one same-run `elpis bench engine` of stock chain-8 and elpis tree-16 at 1K and 8K.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-500}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
echo "=== rows GEMM timeline, input tasks ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 90 python3 elpis/bench/scripts/rows_gemm_timeline.py "$OUT/timeline-tasks.json" 2>&1 \
  | grep -v late_blocks | cut -c1-700 | tail -9 | tee -a "$OUT/log"
gpu_pytest "rows GEMM kernel and patch" 150 tests/kernels/test_rows_gemm.py tests/exl3/test_rows_gemm_patch.py
wait_synth
export BENCH_MARGIN=15
engine_bench same1 1 stock,elpis-tree16 12 3 "Stock chain-8 vs elpis tree-16, GEMM input tasks (call 96), H200"
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
