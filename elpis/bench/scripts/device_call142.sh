#!/bin/bash
# Call 142 (staged in session 34 for a later session; needs .device/ext.so.xz.part-*, see device_common.sh): the
# GPU tests of greedy rounds decided on the GPU (elpis/exl3/device_round.py, registry switch exl3-device-rounds,
# off), none of which has run yet:
# 1. the round's two kernels against the host's Python on the device (tests/kernels/test_round_plan.py,
#    test_round_tail.py) and the zero commit plan they hand a refused round (test_gdn_tree.py);
# 2. rounds on the GPU end to end on the small model (tests/exl3/test_device_round.py: plain decoding's tokens,
#    deep trees of the known continuation with rounds queued ahead, a flagged round discarded and verified
#    again, records faulted on their way back read again from the GPU: session 35), and whether the draft's
#    conditioning on a padded path keeps the committed rows' bits (test_draft_graph.py).
# If they pass, call 143 measures the rounds against host rounds. Run with run(carry=[".whl", ".device"]) and
# ELPIS_GIT_REVISION set. The full-size checkpoints are made beside the tests for a call chained onto this warm
# machine (143, 141).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
start_full_synth
gpu_pytest "round plan and tail kernels, zero commit plan" 200 tests/kernels/test_round_plan.py \
  tests/kernels/test_round_tail.py "tests/kernels/test_gdn_tree.py::test_a_zero_plan_commits_nothing"
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "greedy rounds on the GPU, small model" $(( $(left) - 20 )) \
  tests/exl3/test_device_round.py "tests/exl3/test_draft_graph.py::test_padded_conditioning_keeps_the_committed_rows_bits"
finish_full_synth
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
