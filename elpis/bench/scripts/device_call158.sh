#!/bin/bash
# Call 158 (session 41): the GPU tests of tests/exl3 with the registry's defaults as this revision flips them
# (exl3-device-rounds and exl3-embed-gather on; no switch variables set), after call 156's three failures with
# both switched on were fixed: the row-count buffers of a request after the backend's run changed
# (test_draft_graph.py::test_draft_tree_speculation_through_replays_is_lossless,
# test_gdn_ba_patch.py::test_product_path_with_the_patch) and the conditionings capture_graphs leaves to capture
# (test_tree_graph.py::test_graphs_captured_at_load_leave_nothing_to_capture). Those three run first.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
export ELPIS_SMALL_DIR=/tmp/small
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER
gpu_pytest "call 156's failures, registry defaults" 200 \
  tests/exl3/test_draft_graph.py::test_draft_tree_speculation_through_replays_is_lossless \
  tests/exl3/test_gdn_ba_patch.py::test_product_path_with_the_patch \
  tests/exl3/test_tree_graph.py::test_graphs_captured_at_load_leave_nothing_to_capture
gpu_pytest "exl3 on the small model, registry defaults" $(( $(left) - 10 )) tests/exl3 --durations=10 \
  --deselect tests/exl3/test_draft_graph.py::test_draft_tree_speculation_through_replays_is_lossless \
  --deselect tests/exl3/test_gdn_ba_patch.py::test_product_path_with_the_patch \
  --deselect tests/exl3/test_tree_graph.py::test_graphs_captured_at_load_leave_nothing_to_capture
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
