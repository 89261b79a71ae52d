#!/bin/bash
# Call 172 (session 44): call 170 cut to what a short call holds, after seven refused starts left ~440 s of
# device time. The bench first: stock, elpis chain-8, tree-8 and tree-16 on one load at 1K and 8K (call 166's
# fault and its fix, `DeviceRounds.serves` and `ElpisSystem._capture_rows`; issue 9's 16-row against 8-row
# round in one run); then, with the time left, the round-graph GPU tests (TableUpload's form of c8299eb, records
# compared bit for bit with the pieces').
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-410}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_full_synth
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH
stem=systems-1k8k-call172
echo "=== bench $stem ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 10 )) python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
  --systems stock,elpis,elpis-tree8,elpis-tree16 --checkpoints 1024,8192 --rounds 12 --warmup 3 --final-tokens 0 \
  --time-limit $(( $(left) - 20 )) --out-dir "$OUT" --stem "$stem" \
  --title "stock beside elpis chain-8, tree-8 and tree-16 on one load (rounds on the GPU, composed), rounds and plain" \
  > "$OUT/$stem.txt" 2>&1
echo "bench $stem: exit $?" | tee -a "$OUT/log"
grep -E "^\| (stock|elpis)|^\| [0-9]+K|note|captured the|Error" "$OUT/$stem.md" "$OUT/$stem.txt" 2>/dev/null | head -40 \
  | tee -a "$OUT/log"
if [ "$(left)" -gt 70 ]; then
  export ELPIS_SMALL_DIR=/tmp/small
  timeout -k 2 40 python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1 | tee -a "$OUT/log"
  gpu_pytest "round graphs (defaults)" $(( $(left) - 5 )) tests/exl3/test_round_graph.py
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
