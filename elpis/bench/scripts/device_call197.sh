#!/bin/bash
# Call 197 (session 48; a fresh machine, LIMIT ~250): Nsight Compute on one warm 262K launch of the served tree
# attention (fold build) at 8 rows, the served tree-8 round's case. Call 196 took the served kernel at 1 row and
# found it latency-bound at a quarter occupancy with ~35 % of warp cycles at barriers. Here the warp states and
# the per-source-line stall samples at 8 rows, as input to an occupancy design (bench/results/tree/README.md,
# session 48). Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-250}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_once
echo "=== ncu served, 262K, 8 rows ($(left) s left)" | tee -a "$OUT/log"
timeout $(( $(left) - 25 )) ncu --kernel-name regex:tree_attention_mma_split --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
  --section InstructionStats --section SourceCounters -o /tmp/mma262k8 \
  python3 elpis/bench/scripts/mma_ncu.py 262000 8 3 > /tmp/ncu_run.txt 2>&1
echo "ncu exit $?" | tee -a "$OUT/log"
ncu --import /tmp/mma262k8.ncu-rep --page details > "$OUT/ncu-served-8.txt" 2>&1
ncu --import /tmp/mma262k8.ncu-rep --page source --csv --print-source cuda,sass 2>&1 | xz -T8 > "$OUT/ncu-served-8-sass.csv.xz"
grep -E "Duration|DRAM Throughput|Issued Warp Per|Eligible Warps Per|represents about|stalled" "$OUT/ncu-served-8.txt" \
  | head -12 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
