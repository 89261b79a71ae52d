#!/bin/bash
# Call 11 (session 5, fresh machine): tree rounds without host stalls.
#  1. build (background) and the full-size synthetic checkpoints;
#  2. round_sync_diag.py: host ms per phase and the synchronising torch calls of chain-8, tree-8 (now 8-row
#     verifies) and tree-16 rounds at 1K;
#  3. part treebench (stock chain-8 vs elpis chain-8 vs tree-8 vs tree-16, 1K..128K).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
wait_synth
echo "=== round sync diag ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 170 python3 elpis/bench/scripts/round_sync_diag.py /tmp/full/target /tmp/full/draft \
  > "$OUT/syncdiag.txt" 2>&1
echo "sync diag exit $?" | tee -a "$OUT/log"
grep "^SYNCDIAG" "$OUT/syncdiag.txt" >> "$OUT/log" || tail -20 "$OUT/syncdiag.txt" | tee -a "$OUT/log"
( source elpis/bench/scripts/device_part_treebench.sh ) 2>&1 | tail -5
save_caches >/dev/null
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
