#!/bin/bash
# Call 119 (session 27): the embedding gather (switch exl3-embed-gather, built this session, off).
# 1. GPU tests with the switch on: the gather's own tests (the kernel against ExLlamaV3's lookup, gathered verifies
#    and draft blocks against host-filled ones, lossless speculation), then the tree-graph, draft-graph and verify
#    gate tests, whose backends load with the switch's default and so gather too;
# 2. the round, the switch off, on, off, on (stock chain-8 in the first run), for a pooled A/B (arm A: on);
# 3. host_gaps.py at 1K and 8K with the switch on, one torch thread, no profiler: the host's time per step
#    (graphs.fill was 0.27-0.33 ms in call 117) and the read-back-to-verify path.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_PATCH_EMBED_GATHER=1 gpu_pytest "embedding gather, tree and draft graphs, verify gate (gather on)" 200 \
  tests/exl3/test_embed_gather.py tests/exl3/test_tree_graph.py tests/exl3/test_draft_graph.py \
  tests/exl3/test_verify_gate.py
wait_synth
engine_switch_ab round-embed "embedding gather" ELPIS_PATCH_EMBED_GATHER
echo "=== host gaps, gather on, 1K and 8K, no profiler ($(left) s left)" | tee -a "$OUT/log"
ELPIS_PATCH_EMBED_GATHER=1 timeout -k 5 $(( $(left) - 10 )) python3 elpis/bench/scripts/host_gaps.py \
  /tmp/full/target /tmp/full/draft --contexts 1024,8192 --threads 1 --rounds 24 --profile 0 2>&1 \
  | grep -E "^HOSTGAPS|Error|error" | tee "$OUT/host_gaps_embed.txt" | sed -E 's/"round_ms": \[[^]]*\], //' \
  | cut -c1-900 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
