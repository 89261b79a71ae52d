#!/bin/bash
# Call 26: the tensor-core tree attention after the issue-slot rewrite (ldmatrix fragments, local rows with a
# branch-free output loop below ctx, one select per group for the half codes, the last butterfly as one fma,
# position-major V), which keeps the arithmetic: its tests, every bit against the previous build
# (.device/prev/tree_attention_mma_prev.cu, the source at 3ccd438) with both timed side by side, an Nsight
# Compute profile of the 128K 8-row launch, and treebench. Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
gpu_pytest "mma kernel tests" 100 tests/kernels/test_tree_attention_mma.py
echo "=== bits and timing vs the previous build ($(left) s left)" | tee -a "$OUT/log"
timeout 150 python3 elpis/bench/scripts/mma_vs_previous.py .device/prev/tree_attention_mma_prev.cu 2>&1 \
  | grep -v Warning | tee -a "$OUT/log" | tail -4
echo "=== ncu ($(left) s left)" | tee -a "$OUT/log"
timeout 100 ncu --clock-control none --kernel-name regex:tree_attention_mma_split --launch-skip 3 \
  --launch-count 1 --section LaunchStats --section Occupancy --section SchedulerStats \
  --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats \
  --section SourceCounters -o /tmp/mma128k python3 elpis/bench/scripts/mma_ncu.py 131056 8 5 > /tmp/ncu_run.txt 2>&1
echo "ncu exit $?" | tee -a "$OUT/log"
ncu --import /tmp/mma128k.ncu-rep --page details > "$OUT/ncu_details.txt" 2>&1
ncu --import /tmp/mma128k.ncu-rep --page source --csv --print-source sass 2>&1 | xz -T8 > "$OUT/ncu_sass.csv.xz"
wait_synth
TREEBENCH_MIN=150
( source elpis/bench/scripts/device_part_treebench.sh ) 2>&1 | tail -5
rm -f "$OUT/treebench.png" "$OUT/treebench.txt"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
