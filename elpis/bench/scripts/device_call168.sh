#!/bin/bash
# Call 168 (session 43, ~300 s of device time left): the fix for call 166's fault, on the small synthetic model
# (the full-size synthesis does not fit the time left; call 169 runs the full-size bench). `elpis bench engine`
# of stock, elpis chain-8, tree-8 and tree-16 in one run: call 166's elpis worker stopped at "no captured verify
# of 8 rows at position 1024" when chain-8 shared a load with tree-16. Passes when every elpis system completes
# (the chain system on host rounds, tree-8 with its keys captured before its first request).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-290}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH
stem=systems-small-call168
echo "=== bench $stem ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 10 )) python3 -m elpis.cli bench engine --model /tmp/small/target --draft /tmp/small/draft \
  --systems stock,elpis,elpis-tree8,elpis-tree16 --checkpoints 1024 --rounds 6 --warmup 2 --final-tokens 0 \
  --time-limit $(( $(left) - 20 )) --out-dir "$OUT" --stem "$stem" \
  --title "small model: stock beside elpis chain-8, tree-8 and tree-16 on one load (call 166's fault)" \
  > "$OUT/$stem.txt" 2>&1
echo "bench $stem: exit $?" | tee -a "$OUT/log"
grep -E "^\| (stock|elpis)|note|complete|captured the" "$OUT/$stem.md" "$OUT/$stem.txt" 2>/dev/null | head -30 \
  | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
