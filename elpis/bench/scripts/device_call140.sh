#!/bin/bash
# Call 140 (session 33): the round at 262K with the fold on (ELPIS_PATCH_ATTN_HADAMARD_FOLD=1; gate rule
# exl3-small-tree-r4 PASS, call 139), stock chain-8 in the same run, as calls 130 and 137 measured it without the
# fold (38.30 / 46.44 and 36.07 / 43.90 ms); then, if the device time allows, the 24 GiB test with the fold on.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-470}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
wait_synth
export ELPIS_PATCH_ATTN_HADAMARD_FOLD=1
echo "=== bench 262K, fold on ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 10 )) python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
  --systems stock,elpis-tree16 --checkpoints 262000 --rounds 8 --warmup 2 --final-tokens 0 --spec-only \
  --time-limit $(( $(left) - 20 )) --out-dir "$OUT" --stem round-262k-fold --title "round at 262K, Hadamard fold on" \
  > "$OUT/round-262k-fold.txt" 2>&1
echo "bench exit $?" | tee -a "$OUT/log"
grep -E "^\| (stock|elpis|262K)" "$OUT/round-262k-fold.md" 2>/dev/null | head -8 | tee -a "$OUT/log"
[ "$(left)" -gt 215 ] && gib24_test "tree-16, fold on" $(( $(left) - 5 ))
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
