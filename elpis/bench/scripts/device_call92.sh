#!/bin/bash
# Call 92 (session 21), on what device time was left:
# 1. the fold's arrival with thread 0's own release and acquire fences (the PTX model's patterns, the per-thread
#    fences kept) against the source before it (.device/fold_before.cu, two partials per round): bitwise and time;
# 2. one same-run `elpis bench engine` of stock chain-8 and elpis tree-16 at 1K and 8K (12 rounds after 3 warm-up)
#    with the checkout's kernel;
# 3. GPU tests of the kernel and of the patch in the engine.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
# Ran once in session 21 with 160 s of device time left and measured nothing: the variants ran before the
# background build had written build/kernels/gemm_schedule.h (they now wait for it), and the time ran out in the
# bench's model load. The fence change is reverted on main until this call times it: first
# `git checkout 92c9da1 -- patches/kernels/exl3_gemm_rows.cu` and `git show c00b574:patches/kernels/exl3_gemm_rows.cu
# > .device/fold_before.cu`.
LIMIT=${LIMIT:-420}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
echo "=== rows GEMM: fences ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 60 python3 elpis/bench/scripts/rows_gemm_variants.py .device/fold_before.cu "$OUT/variants.json" \
  served= 2>&1 | tail -18 | tee -a "$OUT/log"
wait_synth
export BENCH_MARGIN=60
engine_bench same1 1 stock,elpis-tree16 12 3 "Stock chain-8 vs elpis tree-16 (call 92), H200"
rm -f "$OUT"/*.png
gpu_pytest "rows GEMM kernel and patch" $(( $(left) - 10 )) tests/kernels/test_rows_gemm.py \
  tests/exl3/test_rows_gemm_patch.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
