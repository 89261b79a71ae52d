#!/bin/bash
# Call 146 (session 36, ran at fa0a25f; the change was reverted after it): the round tail with its commit plan
# out of line (tail_commit_plan, round_tail.cu), after calls 144/145 found the inlined plan refused every path on
# the GPU at -O3. It did not help: every round was still refused, now from the out-of-line call (status -1148 in
# the diagnostic build). The round kernels' GPU tests, then the diagnosis' summary line for the shipped build,
# then, if the time allows, the device-round tests on the small model. Run with run(carry=[".whl", ".device"])
# and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
gpu_pytest "round plan and tail kernels, zero commit plan" 120 tests/kernels/test_round_plan.py \
  tests/kernels/test_round_tail.py "tests/kernels/test_gdn_tree.py::test_a_zero_plan_commits_nothing"
timeout -k 3 100 python3 elpis/bench/scripts/round_tail_diag.py > "$OUT/round_tail_diag.txt" 2>&1
grep -E "^RTDIAG|Error" "$OUT/round_tail_diag.txt" | tee -a "$OUT/log"
[ "$(left)" -gt 60 ] && ELPIS_SMALL_DIR=/tmp/small gpu_pytest "greedy rounds on the GPU, small model" \
  $(( $(left) - 10 )) tests/exl3/test_device_round.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
