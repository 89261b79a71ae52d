#!/bin/bash
# Call 136 (session 32): call 133's Nsight Compute run, now with the extension carried and on the kernel of
# b032579 (score_softmax<kTwo>): one warm 262K launch with 16 rows, warp states and per-instruction stall samples
# (SASS with its CUDA lines), to tell where the score warps still wait. Bounded to the session's last minutes.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-250}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log | tee -a "$OUT/log"; exit 1; }
tail -1 /tmp/build.log | tee -a "$OUT/log"
echo "=== ncu, 262K, 16 rows ($(left) s left)" | tee -a "$OUT/log"
timeout $(( $(left) - 20 )) ncu --clock-control none --kernel-name regex:tree_attention_mma_split --launch-skip 2 \
  --launch-count 1 --section SchedulerStats --section WarpStateStats --section InstructionStats \
  --section SourceCounters -o /tmp/mma262k python3 elpis/bench/scripts/mma_ncu.py 262128 16 3 > /tmp/ncu_run.txt 2>&1
echo "ncu exit $?" | tee -a "$OUT/log"
tail -3 /tmp/ncu_run.txt | tee -a "$OUT/log"
ncu --import /tmp/mma262k.ncu-rep --page details > "$OUT/ncu-details-16.txt" 2>&1
ncu --import /tmp/mma262k.ncu-rep --page source --csv --print-source cuda,sass 2>&1 | xz -T8 > "$OUT/ncu-sass-16.csv.xz"
grep -E "Warp Cycles Per Issued|Issue Slots Busy|Stall" "$OUT/ncu-details-16.txt" | head -20 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
