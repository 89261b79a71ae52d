#!/bin/bash
# Call 59 (issue 9, written in session 14 for the next session): what session 14 changed without a GPU.
# 1. the gate projections kernel's operand shared with ExLlamaV3's merged b/a buffer (`gdn_ba_patch._operand`):
#    the patch tests on the small model (they print on how many layers the operand is shared and require it
#    wherever the layer has the buffer), the kernel tests, the tree verify tests; the tree graph tests
#    (TreeGraphs.commit now takes its moves from tree_verify.commit_moves); the staged round-tail kernel's GPU
#    test (tests/kernels/test_round_tail.py); the sampling GPU test (the lockstep samplers' sorted form of
#    nonzero on the GPU, batch independence);
# 2. the 24 GiB test at 262,000 tokens with the served defaults: its peak (call 56: 19.33 GiB with a copy of
#    its own per layer; expected ~0.05 GiB less).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "gdn ba patch, kernel, tree verify, tree graph and round tail tests" 300 -s \
  tests/exl3/test_gdn_ba_patch.py tests/kernels/test_gdn_ba.py tests/exl3/test_tree_verify.py \
  tests/exl3/test_tree_graph.py tests/kernels/test_round_tail.py tests/spec/test_sampling.py
grep -h "operand shared" "$OUT/pytest.txt" | tee -a "$OUT/log"
wait_synth
gib24_test "tree-16 with graphs, served defaults, 262K"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
