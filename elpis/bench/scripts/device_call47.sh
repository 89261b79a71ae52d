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
bench() {  # stem patch
  echo "=== bench $1 ($(left) s left)" | tee -a "$OUT/log"
  ELPIS_PATCH_ROWS_GEMM=$2 timeout -k 5 $(( $(left) - 10 )) python3 -m elpis.cli bench engine \
    --model /tmp/full/target --draft /tmp/full/draft --systems elpis-tree16 --checkpoints 1024,8192 \
    --rounds 16 --warmup 8 --final-tokens 0 --spec-only --time-limit $(( $(left) - 20 )) --out-dir "$OUT" \
    --stem "$1" --title "issue 9: rows GEMM pooled A/B ($1), H200" > "$OUT/$1.txt" 2>&1
  echo "bench $1: exit $?" | tee -a "$OUT/log"
  grep -E "^\| elpis" "$OUT/$1.md" 2>/dev/null | tee -a "$OUT/log"
}
bench ab-a1 1
bench ab-b1 0
bench ab-a2 1
bench ab-b2 0
rm -f "$OUT"/*.png
python3 elpis/bench/scripts/ab_pooled.py elpis-tree16 "$OUT/ab-pooled.json" --a "$OUT"/ab-a?.json \
  --b "$OUT"/ab-b?.json 2>&1 | tee -a "$OUT/log"
# at most 8 files come back from $OUT: the runs go back as one archive (session 12's call 47 lost six files)
( cd "$OUT" && tar -cf ab-runs.tar ab-a?.* ab-b?.* && rm -f ab-a?.* ab-b?.* )
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
