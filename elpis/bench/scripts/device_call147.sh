#!/bin/bash
# Call 147 (session 37). Calls 144-146 traced the round tail's refusals on the H200 to gdn_tree_commit_plan run in
# the same kernel as the acceptor (the plan given a path from global memory is right, at -O3 too; out of line it
# still refused). round_tail.cu now decides in one kernel and plans in a second, the record between them in
# global memory. This call:
# 1. the nvcc that builds our kernels here;
# 2. round_tail_diag.py: "TSDIAG", the old single-kernel shape with its intermediates (the acceptor's code and
#    path, the plan's code into a shared plan, a local plan, from the path copied through global memory, and with
#    the count and / or the rows hidden from the compiler by an empty asm); "RTDIAG", the new two-kernel source
#    at -O3, ptxas -O0 and -G;
# 3. call 142's GPU tests: the round plan and tail kernels, the zero commit plan, and greedy rounds on the GPU
#    end to end on the small model (test_device_round.py), the draft's padded conditioning;
# 4. the full-size checkpoints beside them, for call 143 chained onto this warm machine.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
start_full_synth
nvcc --version 2>&1 | tail -2 | tee -a "$OUT/log"
echo "=== round tail diagnosis ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 150 python3 elpis/bench/scripts/round_tail_diag.py > "$OUT/round_tail_diag.txt" 2>&1
echo "diag: exit $?" | tee -a "$OUT/log"
grep -E "^TSDIAG|^RTDIAG|Error" "$OUT/round_tail_diag.txt" | tee -a "$OUT/log"
gpu_pytest "round plan and tail kernels, zero commit plan" 120 tests/kernels/test_round_plan.py \
  tests/kernels/test_round_tail.py "tests/kernels/test_gdn_tree.py::test_a_zero_plan_commits_nothing"
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "greedy rounds on the GPU, small model" $(( $(left) - 20 )) \
  tests/exl3/test_device_round.py "tests/exl3/test_draft_graph.py::test_padded_conditioning_keeps_the_committed_rows_bits"
finish_full_synth
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
