#!/bin/bash
# Call 130 (session 31): the round at 262K with the split-warp tree attention (calls 128-129: bit for bit the
# previous kernel's outputs, 1.48 against 1.79 ms a call at 16 rows), stock chain-8 and elpis tree-16 in the same
# run, as call 108 measured them (8 rounds after 2; call 108: 47.26 / 43.58 ms).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready
echo "=== bench 262K ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 10 )) python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
  --systems stock,elpis-tree16 --checkpoints 262000 --rounds 8 --warmup 2 --final-tokens 0 --spec-only \
  --time-limit $(( $(left) - 20 )) --out-dir "$OUT" --stem round-262k --title "round at 262K, split-warp tree attention" \
  > "$OUT/round-262k.txt" 2>&1
echo "bench exit $?" | tee -a "$OUT/log"
grep -E "^\| " "$OUT/round-262k.md" 2>/dev/null | head -12 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
