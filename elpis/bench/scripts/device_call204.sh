#!/bin/bash
# Call 204 (session 51; a fresh machine, LIMIT ~420): what presence_penalty 1.5 costs a round
# (elpis/bench/scripts/penalty_rounds.py) on the full-size synthetic checkpoints, tree-16 served configuration,
# 1K and 8K: greedy (rounds on the GPU) against greedy with the penalty (host rounds), and Qwen's recommended
# sampled settings with and without it (host rounds both). Run with run(carry=[".whl", ".device"]) and
# ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-420}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_full_synth
echo "=== penalty rounds ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 10 )) python3 elpis/bench/scripts/penalty_rounds.py /tmp/full/target /tmp/full/draft \
  --out "$OUT/penalty-rounds.json" --contexts 1024,8192 --tokens 40 --pairs 3 --budget 16 > "$OUT/penalty.txt" 2>&1
echo "penalty rounds: exit $?" | tee -a "$OUT/log"
grep -E "PENALTYAB|Error|error" "$OUT/penalty.txt" | head -10 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
