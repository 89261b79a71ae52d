#!/bin/bash
# Call 133 (staged in session 31 for the next session): where the split-warp tree attention's score warps wait.
# Call 131's diagnostics at 262K with 16 rows: a tile is 9,397 cycles served, 8,399 without the V staging and
# 5,746 without the scores and P, so the eight score warps bound the tile. Nsight Compute on one warm 262K,
# 16-row launch: warp states and per-instruction stall samples (SASS, source-correlated), to tell the ldmatrix
# and mma chains of scores_tile from the softmax's expf, shuffles and 2-byte P stores.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-400}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log | tee -a "$OUT/log"; exit 1; }
echo "=== ncu, 262K, 16 rows ($(left) s left)" | tee -a "$OUT/log"
timeout 200 ncu --clock-control none --kernel-name regex:tree_attention_mma_split --launch-skip 3 \
  --launch-count 1 --section LaunchStats --section Occupancy --section SchedulerStats \
  --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section InstructionStats --section SourceCounters -o /tmp/mma262k \
  python3 elpis/bench/scripts/mma_ncu.py 262128 16 5 > /tmp/ncu_run.txt 2>&1
echo "ncu exit $?" | tee -a "$OUT/log"
ncu --import /tmp/mma262k.ncu-rep --page details > "$OUT/ncu_details.txt" 2>&1
ncu --import /tmp/mma262k.ncu-rep --page source --csv --print-source sass 2>&1 | xz -T8 > "$OUT/ncu_sass.csv.xz"
grep -E "Warp Cycles Per Issued|Issue Slots Busy|Stall|Shared" "$OUT/ncu_details.txt" | head -30 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
