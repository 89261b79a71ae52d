#!/bin/bash
# Call 190 (session 47; a fresh machine, LIMIT ~590): issue 9's per-phase profile of the round at 262,000 tokens,
# stock chain-8 beside elpis tree-8 in one run. The last same-run profiles are at 1K and 8K (call 123, H200);
# at 262K the round is 28.1 ms for tree-8 against 15.3 at 1K (calls 182, 188), and this says which phases take
# the 12.8 ms (the tree attention over the 3-bit cache by session 46's arithmetic, the draft's own attention
# over the context otherwise). Eager tree verifies (the profiler opens its windows on forward calls, which a
# replayed graph does not make); spec rounds only; no prefill window.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_full_synth
STEM=profile-262k-call190
echo "=== profile stock vs elpis-tree8 at 262K, eager tree verifies ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 8 )) python3 -m elpis.cli bench profile --systems stock,elpis-tree8 --tree-eager \
  --model /tmp/full/target --draft /tmp/full/draft --out-dir "$OUT" --time-limit $(( $(left) - 20 )) \
  --checkpoints 262000 --rounds 4 --warmup 1 --final-tokens 0 --spec-only --profile-prefill "" --stem "$STEM" \
  > "$OUT/$STEM.txt" 2>&1
echo "profile: exit $?" | tee -a "$OUT/log"
grep -E "^\| spec" "$OUT/$STEM.md" 2>/dev/null | tee -a "$OUT/log"
grep -vE "it/s\]$" "$OUT/$STEM.txt" | tail -6 | tee -a "$OUT/log"
rm -f "$OUT"/*.png
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
