#!/bin/bash
# Call 169 (staged in session 43 for the next session; call 168 ran its fault's check on the small model): `elpis bench engine` of stock, elpis chain-8, tree-8 and tree-16 in one run at 1K and 8K
# (rounds and plain decode). Call 166 ran stock,elpis,elpis-tree16 and the elpis worker stopped: "no captured
# verify of 8 rows at position 1024" - its chain system's greedy requests went to the rounds on the GPU, which
# are tree rounds and replay only the load's (16-row) keys. Since then a chain-mode backend keeps host rounds
# (`DeviceRounds.serves`) and the bench captures a tree variant's other row count before its first request
# (`ElpisSystem._capture_rows`). Also issue 9's "16-row tree round <= 1.15 x the 8-row round" in one run.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
join_build
wait_synth
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH
stem=systems-1k8k-call169
echo "=== bench $stem ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 15 )) python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
  --systems stock,elpis,elpis-tree8,elpis-tree16 --checkpoints 1024,8192 --rounds 12 --warmup 3 --final-tokens 0 \
  --time-limit $(( $(left) - 25 )) --out-dir "$OUT" --stem "$stem" \
  --title "stock beside elpis chain-8, tree-8 and tree-16 (rounds on the GPU, composed), rounds and plain" \
  > "$OUT/$stem.txt" 2>&1
echo "bench $stem: exit $?" | tee -a "$OUT/log"
grep -E "^\| (stock|elpis)|^\| [0-9]+K|note|captured the" "$OUT/$stem.md" "$OUT/$stem.txt" 2>/dev/null | head -30 \
  | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
