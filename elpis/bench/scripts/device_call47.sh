#!/bin/bash
# Call 47 (issue 9, session 12): the rows GEMM's deciding A/B as redesigned after call 45 (written in
# bench/results/rows_gemm/README.md before this run): tree-16 alone, runs alternating A (ELPIS_PATCH_ROWS_GEMM=1),
# B (=0), A, B on one machine, 16 rounds after 8 warm-up rounds each, at 1K and 8K; the pooled medians decide
# (ab_pooled.py). Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-340}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
[ -f build/kernels/gemm_schedule.h ] || { echo "no gemm_schedule.h after the build" | tee -a "$OUT/log"; exit 1; }
wait_synth
export BENCH_MARGIN=10
title="issue 9: rows GEMM pooled A/B"
engine_bench ab-a1 1 elpis-tree16 16 8 "$title (ab-a1), H200"  # A: the kernel
engine_bench ab-b1 0 elpis-tree16 16 8 "$title (ab-b1), H200"  # B: ExLlamaV3's GEMMs
engine_bench ab-a2 1 elpis-tree16 16 8 "$title (ab-a2), H200"
engine_bench ab-b2 0 elpis-tree16 16 8 "$title (ab-b2), H200"
rm -f "$OUT"/*.png
python3 elpis/bench/scripts/ab_pooled.py elpis-tree16 "$OUT/ab-pooled.json" --a "$OUT"/ab-a?.json \
  --b "$OUT"/ab-b?.json 2>&1 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
