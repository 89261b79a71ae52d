#!/bin/bash
# Call 133 (session 32): where the split-warp tree attention's score warps wait, and the served kernel re-timed.
# Call 131's diagnostics at 262K with 16 rows: a tile is 9,397 cycles served, 8,399 without the V staging and
# 5,746 without the scores and P, so the eight score warps bound the tile.
# 1. mma_vs_previous.py against 05dd87d's source (.device/mma_05dd87d.cu, the build calls 129-132 timed): 2cb6297
#    moved both paths' masking and P into shared helpers with the same floating-point instructions; every bit
#    must match, and the time should too.
# 2. Nsight Compute on one warm 262K launch with 16 rows and with 1 row: warp states and per-instruction stall
#    samples (SASS with its CUDA lines), to tell the ldmatrix and mma chains of scores_tile from the softmax's
#    expf, shuffles and P stores.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
# What happened (a record): the checkout was new and .device held no prebuilt ExLlamaV3 extension, so the first
# import of exllamav3 (tests/kernels/tree_cases.QuantPool) JIT-built it; no step returned within its limit
# (call 134 found why). 9.5 min of device time for nothing; device_common.sh now refuses to start without one.
LIMIT=${LIMIT:-540}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log | tee -a "$OUT/log"; exit 1; }
tail -1 /tmp/build.log | tee -a "$OUT/log"
echo "=== attention: 2cb6297 against 05dd87d ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 150 python3 elpis/bench/scripts/mma_vs_previous.py .device/mma_05dd87d.cu 4093 32760 131050 262128 \
  2>&1 | tee "$OUT/mma-vs-05dd87d.txt" | grep -E 'timing|failures|Error|false' | tee -a "$OUT/log"
for rows in 16 1; do
  echo "=== ncu, 262K, $rows rows ($(left) s left)" | tee -a "$OUT/log"
  timeout 150 ncu --clock-control none --kernel-name regex:tree_attention_mma_split --launch-skip 3 \
    --launch-count 1 --section LaunchStats --section Occupancy --section SchedulerStats \
    --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section InstructionStats --section SourceCounters -o /tmp/mma262k-$rows \
    python3 elpis/bench/scripts/mma_ncu.py 262128 $rows 5 > /tmp/ncu_run.txt 2>&1
  echo "ncu exit $?" | tee -a "$OUT/log"
  tail -3 /tmp/ncu_run.txt | tee -a "$OUT/log"
  ncu --import /tmp/mma262k-$rows.ncu-rep --page details > "$OUT/ncu-details-$rows.txt" 2>&1
  ncu --import /tmp/mma262k-$rows.ncu-rep --page source --csv --print-source cuda,sass 2>&1 \
    | xz -T8 > "$OUT/ncu-sass-$rows.csv.xz"
  grep -E "Warp Cycles Per Issued|Issue Slots Busy|Stall|Bank" "$OUT/ncu-details-$rows.txt" | head -20 | tee -a "$OUT/log"
done
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
