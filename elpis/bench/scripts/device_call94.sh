#!/bin/bash
# Call 94 (session 22, ran at 2babeb5; results in bench/results/rows_gemm/README.md session 22: bit for bit but
# 1.6-1.8x slower, the design was withdrawn after call 95): the rows GEMM's input transform inside its launch (input tasks run by the blocks as they
# start, claimed and waited on through state words) against the served two-launch source
# (.device/served_gemm.cu = `git show 032be7b:patches/kernels/exl3_gemm_rows.cu`):
# 1. rows_gemm_variants.py: bitwise and time on every verify call at 8 and 16 rows;
# 2. the fused build's timeline (ELPIS_GEMM_CLOCKS);
# 3. one same-run `elpis bench engine` of stock chain-8 and elpis tree-16 at 1K and 8K (12 rounds after 3 warm-up);
# 4. GPU tests of the kernel (with the repeated and crowded calls) and of the patch in the engine.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
echo "=== rows GEMM: input tasks in the launch ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 120 python3 elpis/bench/scripts/rows_gemm_variants.py .device/served_gemm.cu "$OUT/variants.json" \
  fused= 2>&1 | tail -18 | tee -a "$OUT/log"
echo "=== rows GEMM timeline, fused ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 90 python3 elpis/bench/scripts/rows_gemm_timeline.py "$OUT/timeline-fused.json" 2>&1 \
  | grep -v late_blocks | cut -c1-700 | tail -9 | tee -a "$OUT/log"
gpu_pytest "rows GEMM kernel and patch" 120 tests/kernels/test_rows_gemm.py tests/exl3/test_rows_gemm_patch.py
wait_synth
export BENCH_MARGIN=15
engine_bench same1 1 stock,elpis-tree16 12 3 "Stock chain-8 vs elpis tree-16, GEMM input in the launch (call 94), H200"
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
