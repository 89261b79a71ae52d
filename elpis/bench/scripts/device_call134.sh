#!/bin/bash
# Call 134 (session 32): call 133 gave nothing back: mma_vs_previous.py printed no line in 150 s (call 129 ran the
# same check over five contexts in 21 s) and both Nsight Compute runs hit their 150 s limits. First find where a
# run of the served kernel stops: mma_ncu.py at 4K, 1 row, then 262K, 16 rows, each under a SIGABRT timeout with
# Python's faulthandler (every thread's stack on the way out). Then, if those return, call 133's two steps with
# tighter limits.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
# What happened (a record): every stack ended in exllamav3's import, waiting on torch's cpp_extension build lock
# (file_baton) while its extension JIT-built: no prebuilt one was carried. The kernel itself was never reached.
LIMIT=${LIMIT:-450}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi | head -20 | tee -a "$OUT/log"
ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log | tee -a "$OUT/log"; exit 1; }
tail -1 /tmp/build.log | tee -a "$OUT/log"
probe() {  # ctx rows limit
  echo "=== probe ctx $1 rows $2 ($(left) s left)" | tee -a "$OUT/log"
  local s=$(date +%s)
  timeout -s ABRT "$3" python3 -X faulthandler elpis/bench/scripts/mma_ncu.py "$1" "$2" 3 2>&1 | tail -25 | tee -a "$OUT/log"
  echo "probe exit ${PIPESTATUS[0]} after $(( $(date +%s) - s )) s" | tee -a "$OUT/log"
}
probe 4093 1 100
probe 262128 16 60
echo "=== attention: 2cb6297 against 05dd87d ($(left) s left)" | tee -a "$OUT/log"
timeout -s ABRT 100 python3 -X faulthandler elpis/bench/scripts/mma_vs_previous.py .device/mma_05dd87d.cu 32760 262128 \
  2>&1 | tee "$OUT/mma-vs-05dd87d.txt" | grep -E 'timing|failures|Error|false|File|Thread' | tee -a "$OUT/log"
echo "=== ncu, 262K, 16 rows ($(left) s left)" | tee -a "$OUT/log"
timeout $(( $(left) - 25 )) ncu --clock-control none --kernel-name regex:tree_attention_mma_split --launch-skip 2 \
  --launch-count 1 --section LaunchStats --section Occupancy --section SchedulerStats \
  --section WarpStateStats --section InstructionStats --section SourceCounters -o /tmp/mma262k \
  python3 elpis/bench/scripts/mma_ncu.py 262128 16 3 > /tmp/ncu_run.txt 2>&1
echo "ncu exit $?" | tee -a "$OUT/log"
tail -4 /tmp/ncu_run.txt | tee -a "$OUT/log"
ncu --import /tmp/mma262k.ncu-rep --page details > "$OUT/ncu-details-16.txt" 2>&1
ncu --import /tmp/mma262k.ncu-rep --page source --csv --print-source cuda,sass 2>&1 | xz -T8 > "$OUT/ncu-sass-16.csv.xz"
grep -E "Warp Cycles Per Issued|Issue Slots Busy|Stall" "$OUT/ncu-details-16.txt" | head -20 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
