#!/bin/bash
# Call 92 (session 21): the served defaults against stock with the fold's two partials per round of loads (call
# 91), on what device time was left: one same-run `elpis bench engine` of stock chain-8 and elpis tree-16 at 1K
# and 8K (12 rounds after 3 warm-up), then the kernel's GPU tests if time remains.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-330}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready
export BENCH_MARGIN=40
engine_bench same1 1 stock,elpis-tree16 12 3 "Stock chain-8 vs elpis tree-16 (call 92), H200"
rm -f "$OUT"/*.png
gpu_pytest "rows GEMM kernel" $(( $(left) - 5 )) tests/kernels/test_rows_gemm.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
