#!/bin/bash
# Call 27: the tensor-core tree attention with the code's float built from its bits (half_value), on top of
# call 26's rewrite: its tests, every bit against the source at 3ccd438 (before both changes) with both timed
# side by side; the engine's tree tests on the small model (lossless tree speculation through eager and
# graph-replayed verifies, row invariance of the logits, the product path); then a 128K-only treebench with
# 16 rounds (call 26's 128K verdict was within a wide noise band). Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
gpu_pytest "mma kernel tests" 100 tests/kernels/test_tree_attention_mma.py
echo "=== bits and timing vs the previous build ($(left) s left)" | tee -a "$OUT/log"
timeout 150 python3 elpis/bench/scripts/mma_vs_previous.py .device/prev/tree_attention_mma_prev.cu 2>&1 \
  | grep -v Warning | tee -a "$OUT/log" | tail -4
gpu_pytest "tree engine tests (small model)" 260 tests/exl3/test_tree_verify.py tests/exl3/test_tree_graph.py
wait_synth
TREEBENCH_MIN=120 TREEBENCH_CHECKPOINTS=131072 TREEBENCH_ROUNDS=16
export TREEBENCH_CHECKPOINTS TREEBENCH_ROUNDS
( source elpis/bench/scripts/device_part_treebench.sh ) 2>&1 | tail -5
rm -f "$OUT/treebench.png" "$OUT/treebench.txt"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
