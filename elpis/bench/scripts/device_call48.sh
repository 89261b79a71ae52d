#!/bin/bash
# Call 48 (issue 9, for session 13): with exl3-rows-gemm on by default in tree mode,
# 1. tests/exl3/test_tree_graph.py on the small model (replays bit for bit their eager warm-ups; not yet run
#    with the patch on);
# 2. `elpis bench profile` of stock and elpis-tree16 at 1K and 8K with eager tree verifies (--tree-eager: a
#    replayed graph opens no profiler window; kernel durations are those of the replays, the gaps are not), so
#    the round's GPU time per phase shows what the next kernel work should take;
# 3. round_sync_diag.py (host time per round with graphs) if time is left.
# $OUT returns at most 8 files: log, pytest.txt, profile.{json,md}, syncdiag.txt.
# Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-580}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "tree graph tests, rows GEMM on" 150 tests/exl3/test_tree_graph.py
wait_synth
tree_profile 90
if [ "$(left)" -gt 70 ]; then
  echo "=== round sync diag, graphs ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 3 $(( $(left) - 8 )) python3 elpis/bench/scripts/round_sync_diag.py /tmp/full/target /tmp/full/draft \
    > "$OUT/syncdiag.txt" 2>&1
  grep "^SYNCDIAG" "$OUT/syncdiag.txt" | cut -c1-400 >> "$OUT/log"
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
