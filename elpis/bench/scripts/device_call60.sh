#!/bin/bash
# Call 60 (issue 9, written in session 14 for the next session): the served defaults against stock, pooled.
# Session 14's same-run benches were disturbed twice out of three (bench/results/tree/README.md), so:
# 1. three same-run `elpis bench engine` runs of stock chain-8 and elpis tree-16 at 1K and 8K (16 rounds after
#    4 warm-up each; their reports list disturbed measurements), pooled per system over the three
#    (`ab_pooled.py elpis-tree16 ... --b-system stock`: elpis faster beyond 2 x the larger pooled MAD?);
# 2. the per-phase profile of both at 1K and 8K (eager tree verifies), with the gate projections kernel on.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set; at most 8 files come back (packed).
LIMIT=${LIMIT:-580}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
wait_synth
export BENCH_MARGIN=150  # each run stops early enough to leave the profile its time
for i in 1 2 3; do
  engine_bench same$i 1 stock,elpis-tree16 16 4 "Stock chain-8 vs elpis tree-16 (call 60, run $i), H200"
done
rm -f "$OUT"/*.png
python3 elpis/bench/scripts/ab_pooled.py elpis-tree16 "$OUT/same-pooled.json" --a "$OUT"/same?.json \
  --b "$OUT"/same?.json --b-system stock 2>&1 | tee -a "$OUT/log"
grep -h -A4 "Disturbed" "$OUT"/same?.md | tee -a "$OUT/log"
tree_profile 10
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
