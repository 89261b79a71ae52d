#!/bin/bash
# Call 98 (session 23), right after call 97 on the same machine (its build and /tmp/full are reused; a fresh
# machine makes them first): one `elpis bench engine` of stock chain-8 and elpis tree-16 as served (the graded
# attention layout, qkv read in place), then the rows GEMM and Gated DeltaNet tree kernel tests that call 96
# could not finish in its limit (the rows GEMM's repeated and crowded calls among them).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready
export BENCH_MARGIN=$(( $(left) - 260 ))
engine_bench same 1 stock,elpis-tree16 12 3 "Stock chain-8 vs elpis tree-16, graded attention splits (call 98), H200"
rm -f "$OUT"/*.png
gpu_pytest "rows GEMM and gdn tree kernels" $(( $(left) - 8 )) tests/kernels/test_rows_gemm.py \
  tests/kernels/test_gdn_tree.py --durations=8
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
