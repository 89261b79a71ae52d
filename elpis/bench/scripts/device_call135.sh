#!/bin/bash
# Call 135 (session 32): the score warps' softmax as one branch-free block per row count (score_softmax<kTwo>):
# the rows' ends and running maxima read before the scores, so that no shared-memory store orders them, and the
# two rows' and two query columns' chains of shuffles and exponentials free to overlap. Same operations on every
# value, so every bit must stay.
# 1. mma_vs_previous.py against 05dd87d's source (the build calls 129-132 timed): bits at 1K-262K, 1-16 rows,
#    and times from 32K; then against 2cb6297's (the review commit, never timed) at 128K and 262K;
# 2. the attention kernels' GPU tests; 3. a variant, never served: scores_tile's k-step loop fully unrolled
#    (.device/mma_v1_unroll.cu; it spills 16 bytes at sm_86, none at sm_90), timed beside the served build at 262K;
# 4. phase clocks at 262K; 5. tree verify and its graphs on the small synthetic model, if the time allows.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-480}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
echo "=== attention: score_softmax against 05dd87d ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 120 python3 elpis/bench/scripts/mma_vs_previous.py .device/mma_05dd87d.cu 1000 4093 32760 131050 262128 \
  2>&1 | tee "$OUT/mma-vs-05dd87d.txt" | grep -E 'timing|failures|Error|false' | tee -a "$OUT/log"
echo "=== attention: score_softmax against 2cb6297 ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 60 python3 elpis/bench/scripts/mma_vs_previous.py .device/mma_2cb6297.cu 131050 262128 \
  2>&1 | tee "$OUT/mma-vs-2cb6297.txt" | grep -E 'timing|failures|Error|false' | tee -a "$OUT/log"
gpu_pytest "attention kernel GPU tests" 90 tests/kernels/test_tree_attention_mma.py
echo "=== attention: served against the unrolled variant ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 45 python3 elpis/bench/scripts/mma_vs_previous.py .device/mma_v1_unroll.cu 262128 \
  2>&1 | tee "$OUT/mma-vs-v1-unroll.txt" | grep -E 'timing|failures|Error|false' | tee -a "$OUT/log"
echo "=== phase clocks ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 60 python3 elpis/bench/scripts/mma_phase_clocks.py 262128 2>&1 | grep -v Warning | tee -a "$OUT/log"
[ "$(left)" -gt 100 ] && ELPIS_SMALL_DIR=/tmp/small gpu_pytest "tree verify and graphs, small model" $(( $(left) - 10 )) \
  tests/exl3/test_tree_verify.py tests/exl3/test_tree_graph.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
