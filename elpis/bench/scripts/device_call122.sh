#!/bin/bash
# Call 122 (staged in session 27 for the next session): the embedding gather (switch exl3-embed-gather, off) and
# the staged uploads after calls 119-121.
# 1. GPU tests with the gather on: the gather's tests (call 121's one failure was the test comparing a [16, hidden]
#    tensor with a [1, 16, hidden] one; fixed), the tree graphs (replays against eager tree mode through the
#    staged uploads), the verify gate;
# 2. the round, the gather off / on / on with the verify gate, three times (stock chain-8 in the first run):
#    call 121's single "on" run gave -0.32 / -0.52 ms at 1K / 8K against the staged tree without it, call 119's
#    A/B (before the uploads were staged) was within noise;
# 3. if time is left, host_gaps.py at 1K with the gather on, one torch thread, no torch profiler, with Python's
#    collector as it is and then frozen: the host's time per step with the staged uploads (graphs.fill and its
#    parts, graphs.commit, condition, draft.block), and a cProfile window (where the fill's 0.31 ms goes).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_PATCH_EMBED_GATHER=1 gpu_pytest "embedding gather, tree graphs, verify gate (gather on)" 170 \
  tests/exl3/test_embed_gather.py tests/exl3/test_tree_graph.py tests/exl3/test_verify_gate.py
wait_synth
for pass in 1 2 3; do
  systems=elpis-tree16; [ $pass = 1 ] && systems=stock,elpis-tree16
  [ "$(left)" -gt 150 ] && ELPIS_PATCH_EMBED_GATHER=0 engine_bench "round-gather-off-$pass" 1 "$systems" 12 3 \
    "gather off $pass"
  [ "$(left)" -gt 120 ] && ELPIS_PATCH_EMBED_GATHER=1 engine_bench "round-gather-on-$pass" 1 elpis-tree16 12 3 \
    "gather on $pass"
  # with the verify gate as well: the gate then copies only the integer inputs
  [ "$(left)" -gt 90 ] && ELPIS_PATCH_EMBED_GATHER=1 ELPIS_PATCH_VERIFY_PRELAUNCH=1 engine_bench \
    "round-gather-gate-$pass" 1 elpis-tree16 12 3 "gather and gate $pass"
done
if [ "$(left)" -gt 100 ]; then
  echo "=== host gaps, gather on, 1K, collector default/frozen, cProfile ($(left) s left)" | tee -a "$OUT/log"
  ELPIS_PATCH_EMBED_GATHER=1 timeout -k 5 $(( $(left) - 8 )) python3 elpis/bench/scripts/host_gaps.py \
    /tmp/full/target /tmp/full/draft --contexts 1024 --threads 1 --rounds 24 --gc default,freeze --cprofile 1 \
    --profile 0 2>&1 | grep -E "^HOSTGAPS|Error|error" | tee "$OUT/host_gaps_gather.txt" \
    | sed -E 's/"round_ms": \[[^]]*\], //; s/"cprofile": .*//' | cut -c1-1200 | tee -a "$OUT/log"
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
