#!/bin/bash
# Call 29 (issue 9, for planning the 1-16-row EXL3 GEMM): Nsight Compute over the first 80 kernels of one
# warm 8-row chain verify of the full-size synthetic target with ExLlamaV3's own kernels
# (elpis/bench/scripts/gemm_ncu.py): duration, instruction mix, warp stalls and the achieved fraction of
# DRAM bandwidth per kernel. Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-540}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
( ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build ) >/tmp/build.log 2>&1 &
BUILD=$!
python3 -m elpis.cli synth --full /tmp/full/target > /tmp/synth.log 2>&1
tail -1 /tmp/synth.log | tee -a "$OUT/log"
wait $BUILD; tail -2 /tmp/build.log | tee -a "$OUT/log"
echo "=== ncu ($(left) s left)" | tee -a "$OUT/log"
timeout $(( $(left) - 40 )) ncu --clock-control none --nvtx --nvtx-include "verify8/" --launch-count 80 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section InstructionStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  -o /tmp/gemm python3 elpis/bench/scripts/gemm_ncu.py /tmp/full/target > /tmp/ncu_run.txt 2>&1
echo "ncu exit $?" | tee -a "$OUT/log"
tail -4 /tmp/ncu_run.txt | tee -a "$OUT/log"
ncu --import /tmp/gemm.ncu-rep --page details 2>&1 | xz -T8 > "$OUT/ncu_gemm_details.txt.xz"
ncu --import /tmp/gemm.ncu-rep --page raw --csv --metrics gpu__time_duration.sum,dram__bytes.sum,smsp__inst_executed.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed 2>&1 | xz -T8 > "$OUT/ncu_gemm_raw.csv.xz"
ls -la "$OUT" | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
