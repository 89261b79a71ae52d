#!/bin/bash
# Call 174 (session 45), after call 173 on the same session's budget (~530 s of device time left for a fresh
# machine's start and this). `exl3-draft-candidates` is now on by default (two A/Bs agree: calls 164 and 173).
# 1. GPU tests with the registry's defaults, so with the candidates kernel in every drafter: its kernel tests,
#    rounds on the GPU and composed round graphs (records compared bit for bit with the pieces');
# 2. with more than 150 s left, the bench under the new group budgets (`cli.group_budget`: call 173's even split gave
#    stock less than its first load): stock beside tree-8 and tree-16 where ~290 s remain, else the two trees.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-500}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH ELPIS_PATCH_DRAFT_CANDIDATES
export ELPIS_SMALL_DIR=/tmp/small
gpu_pytest "defaults with draft candidates on: kernel, rounds on the GPU, round graphs" 160 \
  tests/kernels/test_draft_candidates.py tests/exl3/test_device_round.py tests/exl3/test_round_graph.py
finish_full_synth
systems=elpis-tree8,elpis-tree16
[ "$(left)" -gt 290 ] && systems=stock,$systems
if [ "$(left)" -gt 150 ]; then
  systems_bench systems-1k8k-call174 8 "$systems under group budgets, draft candidates on (defaults)" "$systems"
fi
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
