#!/bin/bash
# Call 50 (issue 9, session 13): the draft's conditioning after a commit replayed from CUDA graphs
# (`DraftGraphs.condition`).
# 1. GPU tests on the small model: draft graph tests (replay == eager conditioning bit for bit, lossless
#    product path through replays), tree graph tests;
# 2. the A/B on the full-size synthetic model: tree-16 rounds at 1K with conditioning replayed vs eager,
#    alternating runs pooled (round_sync_diag.py --conditioning-ab 8);
# 3. round_sync_diag (host time per phase) with everything on.
# Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-580}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "draft and tree graph tests" 200 tests/exl3/test_draft_graph.py \
  tests/exl3/test_tree_graph.py
wait_synth
echo "=== conditioning A/B ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 $(( $(left) - 100 )) python3 elpis/bench/scripts/round_sync_diag.py /tmp/full/target /tmp/full/draft \
  --conditioning-ab 8 > "$OUT/condab.txt" 2>&1
echo "conditioning A/B: exit $?" | tee -a "$OUT/log"
grep "^CONDAB" "$OUT/condab.txt" | grep '"pooled"' | tee -a "$OUT/log"
if [ "$(left)" -gt 60 ]; then
  echo "=== round sync diag ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 3 $(( $(left) - 8 )) python3 elpis/bench/scripts/round_sync_diag.py /tmp/full/target /tmp/full/draft \
    > "$OUT/syncdiag.txt" 2>&1
  grep "^SYNCDIAG" "$OUT/syncdiag.txt" | grep '"sync_debug": false' | cut -c1-330 >> "$OUT/log"
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
