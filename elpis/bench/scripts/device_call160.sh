#!/bin/bash
# Call 160 (session 42): rounds on the GPU as one composed graph launch a round key (exl3-round-graph,
# elpis/exl3/round_graph.py), against issue 9's host time per round (2.3 ms at 1K with pieces, call 157).
# First their GPU tests (records bit for bit the pieces', edges, record faults, stand-ins), then the in-process
# A/B pieces vs graph at 1K and 8K with each arm's host time and a profile of 16 rounds an arm, then the GPU
# tests every capture's keep_graph touches (device rounds, draft graphs, tree graphs) and call 159's span
# kernels' tests, with what time is left.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
join_build
export ELPIS_SMALL_DIR=/tmp/small
gpu_pytest "round graphs" 240 tests/exl3/test_round_graph.py
wait_synth
ab round-graph-ab-call160 150 round_graph_ab.py --contexts 1024,8192 --pairs 3 --profile-rounds 16
gpu_pytest "device rounds, draft and tree graphs (kept captures), span kernels" $(( $(left) - 8 )) \
  tests/exl3/test_device_round.py tests/exl3/test_draft_graph.py tests/exl3/test_tree_graph.py \
  tests/kernels/test_verify_epilogue.py tests/kernels/test_draft_candidates.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
