#!/bin/bash
# Call 170 (session 44, a fresh machine): what session 43 changed and no GPU has run, then staged call 169.
# - GPU tests: the round graphs (TableUpload now keeps its buffers and values as tuples of one shape, c8299eb;
#   test (f) compares the composed records with the pieces' bit for bit), the device rounds, the uploads.
# - `elpis bench engine` of stock, elpis chain-8, tree-8 and tree-16 on one load at 1K and 8K (call 166's fault:
#   the chain system's greedy requests went to the GPU's tree rounds; fixed by `DeviceRounds.serves` and
#   `ElpisSystem._capture_rows`). Passes when every system completes. Also issue 9's "16-row tree round
#   <= 1.15 x the 8-row round", both in one run, and the peak with both row counts' keys captured.
# - If time is left, call 171's host profile at 8K.
# A short call: BENCH_TAIL (s kept after the bench, default 100) and MORE_TESTS= (the round-graph tests alone).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
join_build
export ELPIS_SMALL_DIR=/tmp/small
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH
gpu_pytest "round graphs, device rounds, uploads (defaults)" 200 tests/exl3/test_round_graph.py ${MORE_TESTS-\
  tests/exl3/test_device_round.py tests/exl3/test_upload.py}
wait_synth
stem=systems-1k8k-call170
echo "=== bench $stem ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - ${BENCH_TAIL:-100} )) python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
  --systems stock,elpis,elpis-tree8,elpis-tree16 --checkpoints 1024,8192 --rounds 12 --warmup 3 --final-tokens 0 \
  --time-limit $(( $(left) - ${BENCH_TAIL:-100} - 10 )) --out-dir "$OUT" --stem "$stem" \
  --title "stock beside elpis chain-8, tree-8 and tree-16 on one load (rounds on the GPU, composed), rounds and plain" \
  > "$OUT/$stem.txt" 2>&1
echo "bench $stem: exit $?" | tee -a "$OUT/log"
grep -E "^\| (stock|elpis)|^\| [0-9]+K|note|captured the|Error" "$OUT/$stem.md" "$OUT/$stem.txt" 2>/dev/null | head -40 \
  | tee -a "$OUT/log"
# call 171's first step, in case no second call fits: the host profile at 8K (call 164: 0.23 ms against 0.12 at 1K)
echo "=== host profile at 8192 ($(left) s left)" | tee -a "$OUT/log"
[ "$(left)" -gt 60 ] && timeout -k 3 $(( $(left) - 8 )) python3 elpis/bench/scripts/device_round_host_profile.py /tmp/full/target /tmp/full/draft \
  --context 8192 --tokens 60 --top 45 --round-graph on > "$OUT/hostprof-8192-call170.txt" 2>&1
echo "host profile 8192: exit $?" | tee -a "$OUT/log"
grep -E "HOSTPROF|function calls" "$OUT/hostprof-8192-call170.txt" | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
