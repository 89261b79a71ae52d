#!/bin/bash
# Call 68 (session 17), after call 67's load-time capture test failed (a verify's pages past the draft block's
# bucket; the drafter now passes the block's own pages): that test, the draft graph, snapshot and prefix
# tests call 67 did not reach, then the served prefill bench, stock and elpis-tree16 at 8K and 32K, with graphs captured at load (no captures in the first
# round), background snapshot copies and one torch thread between prefills; compare calls 65-66.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "graphs at load (again), draft buckets, background snapshots" 200 -x \
  "tests/exl3/test_tree_graph.py::test_graphs_captured_at_load_leave_nothing_to_capture" \
  tests/exl3/test_draft_graph.py \
  "tests/exl3/test_gpu.py::test_snapshot_copies_what_stash_copies" "tests/exl3/test_gpu.py::test_prefix_reuse_is_exact"
wait_synth
served_bench prefillbench "issue 10: served prefill (graphs captured at load, background snapshots), stock vs elpis, H200" --spec-only
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
