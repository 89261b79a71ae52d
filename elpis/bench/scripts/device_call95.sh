#!/bin/bash
# Call 95 (ran at 1788f41: still 1.2-1.5x slower than two launches, so the input tasks were withdrawn; results in
# bench/results/rows_gemm/README.md session 22). Call 95 (session 22, on the ~590 s of device time left, so calls 95 and 96 in one): call 94's GEMM with the input
# tasks ran twice as long, most likely because every waiting warp made a compare-and-swap on each pending task's
# word in turn. The wait now reads the states with plain loads and steals only a task still free on a second look.
# 1. its build with each fragment load (ELPIS_GEMM_FRAG_LOAD: 1 L2 only as in call 94, 2 ld.ca) against the served
#    two-launch source (.device/served_gemm.cu), bitwise and time on every verify call;
# 2. the faster of the two made the source's default here, then the kernel's GPU tests;
# 3. one same-run `elpis bench engine` of stock chain-8 and elpis tree-16 on what time is left.
# Run with run(carry=[".whl", ".device", "build/kernels"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-380}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
echo "=== rows GEMM: input tasks, fragment loads ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 150 python3 elpis/bench/scripts/rows_gemm_variants.py .device/served_gemm.cu "$OUT/variants.json" \
  ldcg=ELPIS_GEMM_FRAG_LOAD:1 ldca=ELPIS_GEMM_FRAG_LOAD:2 2>&1 | tail -18 | tee -a "$OUT/log"
PICK=$(python3 -c "
import json; v = json.load(open('$OUT/variants.json'))['verify_ms']['16']
print(1 if v['ldcg'] <= v['ldca'] else 2)" 2>/dev/null || echo 1)
sed -i "s/^#define ELPIS_GEMM_FRAG_LOAD 1$/#define ELPIS_GEMM_FRAG_LOAD $PICK/" patches/kernels/exl3_gemm_rows.cu
echo "fragment load picked: $PICK ($(grep -c "^#define ELPIS_GEMM_FRAG_LOAD $PICK$" patches/kernels/exl3_gemm_rows.cu))" | tee -a "$OUT/log"
wait_build
gpu_pytest "rows GEMM kernel" 60 tests/kernels/test_rows_gemm.py
wait_synth
export BENCH_MARGIN=10
engine_bench same1 1 stock,elpis-tree16 8 2 "Stock chain-8 vs elpis tree-16, GEMM input tasks (call 95), H200"
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
