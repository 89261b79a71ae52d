#!/bin/bash
# Call 63 (issue 10, written in session 15 for the next session): prefill with the served defaults (tree
# mode, layer-major prefill groups on).
# 1. the small-model engine tests with the new default (test_gpu.py: lossless speculation, elpis's chain
#    verify token for token stock's generator, prefix reuse GPU tier and disk across a restart; all prefill in
#    groups now), the groups' own test, and whether a tree row's logits are the same at 8 and 16 rows per
#    verify (test_tree_verify.py::test_a_row_is_the_same_at_either_run_size: what choosing the run size per
#    verify would rely on).
# Call 64 then profiles and benches the served prefill against stock.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set; at most 8 files come back (packed).
LIMIT=${LIMIT:-480}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "engine tests with prefill groups" 330 -k "not 24gib" \
  tests/exl3/test_gpu.py tests/exl3/test_prefill_groups.py "tests/exl3/test_tree_verify.py::test_a_row_is_the_same_at_either_run_size"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
