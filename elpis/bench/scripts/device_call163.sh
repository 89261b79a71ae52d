#!/bin/bash
# Call 163 (staged in session 42 for the next session): the round graphs' fix for a backend whose row count
# changed (a new pool after every composed graph was dropped: call 162 met PyTorch's allocator assert in
# test_gdn_ba_patch.py::test_product_path_with_the_patch), its new GPU test, and the tests/exl3 files call
# 161-162 did not run with round graphs on by default; then the pieces-vs-graph A/B again at 8K, where call 160
# measured 1.73 ms of host time a round and call 161's cProfile about 0.4 (host_time now reports the staged
# uploads' waits apart: upload_wait_ms); then the draft-candidates kernel (4 launches for torch's ~8) switch A/B
# at 1K, now that a round is one graph and its GPU idle (~0.8 ms) is the gaps between its 1,586 kernels.
# Since call 162 the block tables' uploads are also skipped where the key's table already holds the pages
# (`put_table`'s memory): the round-graph tests' records comparison and the A/B's tokens check it.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
join_build
export ELPIS_SMALL_DIR=/tmp/small
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH
gpu_pytest "round graphs (a row-count change; tables' uploads skipped), defaults" 300 tests/exl3/test_round_graph.py \
  tests/exl3/test_gdn_ba_patch.py::test_product_path_with_the_patch tests/exl3/test_device_round.py
gpu_pytest "the rest of tests/exl3, defaults" 90 tests/exl3/test_rows_gemm_patch.py \
  tests/exl3/test_prefill_groups.py tests/exl3/test_slice_pointers.py tests/exl3/test_upload.py
wait_synth
ab round-graph-ab-call163 100 round_graph_ab.py --contexts 8192 --pairs 3
ab switch-ab-candidates-call163 10 switch_ab.py --switches exl3-draft-candidates --contexts 1024 --pairs 3
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
