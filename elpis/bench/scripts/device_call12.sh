#!/bin/bash
# Call 12 (session 5): tree rounds after the stream-ordered slice pointers (patch exl3-async-slice-pointers).
#  1. build (background) and the full-size synthetic checkpoints;
#  2. round_sync_diag.py again: what synchronises a round now, host ms per phase;
#  3. part treebench (stock chain-8 vs elpis chain-8 vs tree-8 vs tree-16, 1K..128K);
#  4. GPU tests on the full-size model: the patch against ExLlamaV3's own pointer table, and tree verify
#     losslessness and row invariance with 8- and 16-row verifies.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
wait_synth
echo "=== round sync diag ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 150 python3 elpis/bench/scripts/round_sync_diag.py /tmp/full/target /tmp/full/draft \
  > "$OUT/syncdiag.txt" 2>&1
echo "sync diag exit $?" | tee -a "$OUT/log"
grep "^SYNCDIAG" "$OUT/syncdiag.txt" >> "$OUT/log" || tail -20 "$OUT/syncdiag.txt" | tee -a "$OUT/log"
( source elpis/bench/scripts/device_part_treebench.sh ) 2>&1 | tail -5
echo "=== GPU tests, full size ($(left) s left)" | tee -a "$OUT/log"
ELPIS_SMALL_DIR=/tmp/full ELPIS_TREE_LOG="$OUT/log" timeout -k 3 $(( $(left) - 15 )) python3 -m pytest -m gpu \
  tests/exl3/test_slice_pointers.py tests/exl3/test_tree_verify.py -q -p no:cacheprovider -rfEs --tb=short \
  --durations=8 > "$OUT/tree_pytest.txt" 2>&1
echo "tests exit $?" | tee -a "$OUT/log"
grep -E "passed|failed|^FAILED|^E |s call" "$OUT/tree_pytest.txt" | tail -16 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
