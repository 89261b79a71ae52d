#!/bin/bash
# Call 84 (session 20): which pipe bounds elpis's rows GEMM. Nsight Compute on one warm launch of the MLP gate
# projection (5120 -> 17408) at 16 rows (elpis's kernel and ExLlamaV3's, rows_gemm_ncu.py): per-pipe
# utilisation (ALU, FMA and its heavy half, tensor, LSU), issue activity, warp stall reasons and the
# executed instruction mix. The static SASS of the main loop (session 20) counts, per 16x16 tile and warp,
# 12 PRMT + 3 SHF on the ALU pipe and 8 IMAD + 8 IDP4A on the FMA-heavy pipe, both 16 lanes per cycle per
# scheduler on sm_90 (two cycles a warp instruction), against ~43 issue slots. Run with
# run(carry=[".whl", ".device", "build/kernels"]).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-missing}" | tee -a "$OUT/log"
METRICS=sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active
METRICS=$METRICS,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fp16.avg.pct_of_peak_sustained_active
METRICS=$METRICS,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active
METRICS=$METRICS,sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active
METRICS=$METRICS,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active
METRICS=$METRICS,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_active.avg,gpc__cycles_elapsed.max
for rows in 16 8; do
  timeout 150 "$NCU" --clock-control none --nvtx --nvtx-include "gemm/" --launch-count 3 \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats \
    --section ComputeWorkloadAnalysis --section Occupancy --metrics "$METRICS" --print-details all \
    python3 elpis/bench/scripts/rows_gemm_ncu.py 5120 17408 $rows > "$OUT/ncu_gate$rows.txt" 2>&1
  echo "ncu $rows rows: exit $?" | tee -a "$OUT/log"
  grep -E "^  [a-z_]+.*\(|pipe_|issue_active|cycles_active.avg|cycles_elapsed|Duration|Issue Slots Busy|Warp Cycles Per Issued|Eligible Warps|Registers Per" \
    "$OUT/ncu_gate$rows.txt" | cut -c1-120 | tee -a "$OUT/log"
done
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
