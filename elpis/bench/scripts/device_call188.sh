#!/bin/bash
# Call 188 (staged in session 46 for a later session, after call 187; a fresh machine, LIMIT 590): stock beside
# tree-8 and tree-16 at 262,000 tokens in one run on the H100. Call 182 measured the trees there alone (28.07 / 34.91 ms); stock's
# 262K round has been measured beside elpis only on the H200 (call 140: 49.20 ms against tree-16's 35.63). Each
# system prefills 262K once (stock ~80 s after a ~100 s first load on a fresh machine, the trees ~66-70 s), so
# only the spec rounds are timed; `cli.group_budget` keeps 90 s for each later worker group.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_full_synth
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH ELPIS_PATCH_DRAFT_CANDIDATES
STEM=systems-262k-call188
echo "=== bench $STEM ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 8 )) python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
  --systems stock,elpis-tree8,elpis-tree16 --checkpoints 262000 --rounds 8 --warmup 2 --final-tokens 0 \
  --spec-only --time-limit $(( $(left) - 20 )) --out-dir "$OUT" --stem "$STEM" \
  --title "stock beside tree-8 and tree-16 at 262K (one run)" > "$OUT/$STEM.txt" 2>&1
echo "bench $STEM: exit $?" | tee -a "$OUT/log"
grep -E "^\| (stock|elpis|262K)|Host CPU|GiB allocated" "$OUT/$STEM.md" 2>/dev/null | tee -a "$OUT/log"
tail -3 "$OUT/$STEM.txt" | tee -a "$OUT/log"
rm -f "$OUT"/*.png
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
