#!/bin/bash
# Call 25: the captured graphs after the host-side refactors of their static inputs (elpis.exl3.upload;
# 193fec0) and of the plain module path both captures run (elpis.exl3.capture; 3ccd438), neither run on a
# GPU yet; the served tensor-core kernel's tests (SASS byte-identical to call 21's: a check of the build);
# and an Nsight Compute profile of one warm 128K, 8-row launch of its split kernel (warp stall reasons and
# the source-level stall samples, to direct the 128K work of issue 8). Treebench is left out: its kernels
# are call 21's. Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-575}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
( time ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build ) >/tmp/build.log 2>&1
tail -3 /tmp/build.log | tee -a "$OUT/log"
gpu_pytest "graph tests (tree verify, draft block)" 240 tests/exl3/test_tree_graph.py tests/exl3/test_draft_graph.py
gpu_pytest "mma kernel tests" 100 tests/kernels/test_tree_attention_mma.py
echo "=== ncu ($(left) s left)" | tee -a "$OUT/log"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-missing}" | tee -a "$OUT/log"
if [ -n "$NCU" ]; then
  timeout 150 "$NCU" --clock-control none --kernel-name regex:tree_attention_mma_split --launch-skip 3 \
    --launch-count 1 --section LaunchStats --section Occupancy --section SchedulerStats \
    --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section InstructionStats --section SourceCounters -o /tmp/mma128k \
    python3 elpis/bench/scripts/mma_ncu.py 131056 8 5 > /tmp/ncu_run.txt 2>&1
  echo "ncu exit $?" | tee -a "$OUT/log"
  tail -5 /tmp/ncu_run.txt | tee -a "$OUT/log"
  "$NCU" --import /tmp/mma128k.ncu-rep --page details > "$OUT/ncu_details.txt" 2>&1
  "$NCU" --import /tmp/mma128k.ncu-rep --page source --csv --print-source sass 2>&1 | xz -T8 > "$OUT/ncu_sass.csv.xz"
  ls -la "$OUT"/ncu* | tee -a "$OUT/log"
fi
save_caches > /dev/null 2>&1
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
