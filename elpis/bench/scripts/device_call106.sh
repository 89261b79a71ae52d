#!/bin/bash
# Call 106 (session 24, on call 105's warm machine): the 2048-position splits past 65536 in the full model.
# 1. the 24 GiB test at 262,000 tokens, tree-16 with graphs (the partials' workspace halves at 262K);
# 2. `elpis bench engine` at 128K, stock chain-8 and elpis tree-16 in the same run (12 rounds after 3).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready
gib24_test "2048-position splits" 230  # call 106 ran it unquoted (exit 125); call 107 ran it alone
echo "=== bench 128K ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 15 )) python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
  --systems stock,elpis-tree16 --checkpoints 131072 --rounds 12 --warmup 3 --final-tokens 0 --spec-only \
  --time-limit $(( $(left) - 25 )) --out-dir "$OUT" --stem round-128k --title "round at 128K, 2048-position splits" \
  > "$OUT/round-128k.txt" 2>&1
echo "bench exit $?" | tee -a "$OUT/log"
grep -E "^\| " "$OUT/round-128k.md" 2>/dev/null | head -12 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
