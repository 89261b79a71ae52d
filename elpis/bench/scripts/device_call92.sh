#!/bin/bash
# Call 92 (staged in session 21, run in session 22):
# 1. the fold's arrival with thread 0's own release and acquire fences (the PTX model's patterns, the per-thread
#    fences kept; .device/fence_form.cu) against the served source (.device/served_gemm.cu): bitwise and time;
# 2. one same-run `elpis bench engine` of stock chain-8 and elpis tree-16 at 1K and 8K (12 rounds after 3 warm-up)
#    with the served kernel;
# 3. GPU tests of the kernel and of the patch in the engine.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set. Before it:
# `git show HEAD:patches/kernels/exl3_gemm_rows.cu > .device/served_gemm.cu`, and .device/fence_form.cu the served
# source with thread 0's `atomic_inc` between two fences (the second only in the last block).
# Session 21's attempt (160 s left) measured nothing: the variants ran before the background build had finished
# and the bench ran out of time; the variants now wait for the build.
LIMIT=${LIMIT:-540}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
echo "=== rows GEMM: fences ($(left) s left)" | tee -a "$OUT/log"
cp .device/fence_form.cu patches/kernels/exl3_gemm_rows.cu
timeout -k 5 90 python3 elpis/bench/scripts/rows_gemm_variants.py .device/served_gemm.cu "$OUT/variants.json" \
  fence= 2>&1 | tail -18 | tee -a "$OUT/log"
cp .device/served_gemm.cu patches/kernels/exl3_gemm_rows.cu
wait_synth
export BENCH_MARGIN=60
engine_bench same1 1 stock,elpis-tree16 12 3 "Stock chain-8 vs elpis tree-16 (call 92), H200"
rm -f "$OUT"/*.png
gpu_pytest "rows GEMM kernel and patch" $(( $(left) - 10 )) tests/kernels/test_rows_gemm.py \
  tests/exl3/test_rows_gemm_patch.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
