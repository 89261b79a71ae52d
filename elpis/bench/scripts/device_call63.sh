#!/bin/bash
# Call 63 (issue 10, written in session 15 for the next session): prefill with the served defaults (tree
# mode, layer-major prefill groups on).
# 1. the small-model engine tests with the new default (test_gpu.py: lossless speculation, elpis's chain
#    verify token for token stock's generator, prefix reuse GPU tier and disk across a restart; all prefill in
#    groups now), the groups' own test, and whether a tree row's logits are the same at 8 and 16 rows per
#    verify (test_tree_verify.py::test_a_row_is_the_same_at_either_run_size: what choosing the run size per
#    verify would rely on), and that a zero commit plan (the round-tail kernel's no-op) leaves the GDN state;
# 2. issue 9's host time: `host_gaps.py` on /tmp/full, what the host does while the GPU sits idle inside
#    greedy tree-16 rounds at 1K and 8K (GPU idle per round split by labelled host step and by torch op or
#    CUDA call).
# Call 64 then profiles and benches the served prefill against stock.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set; at most 8 files come back (packed).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "engine tests with prefill groups" 320 -k "not 24gib" \
  tests/exl3/test_gpu.py tests/exl3/test_prefill_groups.py "tests/exl3/test_tree_verify.py::test_a_row_is_the_same_at_either_run_size" \
  "tests/kernels/test_gdn_tree.py::test_a_zero_plan_commits_nothing"
wait_synth
echo "=== host gaps ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 10 )) python3 elpis/bench/scripts/host_gaps.py /tmp/full/target /tmp/full/draft \
  --contexts 1024,8192 --rounds 12 2>&1 | grep -E "^HOSTGAPS|Error|error" | tee "$OUT/host_gaps.txt" | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
