#!/bin/bash
# Call 161 (session 42): exl3-round-graph on by default. With the registry's defaults (no switch variables):
# tests/exl3 on the small model while the full-size synthesis runs (test_round_graph.py ran in call 160), the
# 24 GiB test at 262,000 tokens with rounds on the GPU as composed graphs, the host's time per round at 8K under
# cProfile (call 160: 1.73 ms there against 0.22 at 1K), then `elpis bench engine` beside stock at 1K and 8K.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
join_build
export ELPIS_SMALL_DIR=/tmp/small
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH
gpu_pytest "exl3 on the small model, registry defaults (round graphs on)" 200 tests/exl3 --durations=5 \
  --deselect tests/exl3/test_round_graph.py
wait_synth
gib24_test "composed round graphs (registry defaults)" 140 tree-16-device-rounds
echo "=== host profile 8K, composed ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 80 python3 elpis/bench/scripts/device_round_host_profile.py /tmp/full/target /tmp/full/draft \
  --context 8192 --top 25 > "$OUT/host-profile-8k.txt" 2>&1
echo "host profile: exit $?" | tee -a "$OUT/log"
grep -E "HOSTPROF|function calls" "$OUT/host-profile-8k.txt" | tee -a "$OUT/log"
engine_bench round-1k8k-graph 1 stock,elpis-tree16 12 3 "elpis tree-16, rounds on the GPU as composed graphs"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
