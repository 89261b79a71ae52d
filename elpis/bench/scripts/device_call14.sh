#!/bin/bash
# Call 14 (session 5): graph-captured commits, row-dealt tensor-core attention, graphs on by default.
#  1. build (background) and the full-size synthetic checkpoints;
#  2. tests/exl3/test_tree_graph.py (replays vs eager, commits through graphs vs eager commits, abandon,
#     losslessness) and the tensor-core kernel tests (rows dealt to several blocks at short contexts);
#  3. part treebench (tree systems replay graphs by default);
#  4. the 24 GiB test in tree mode with graphs: 262,000-token prefill + 128 tokens, every verify 16 rows;
#  5. round_sync_diag.py: host ms per phase with graphs;
#  6. the eager tree verify tests.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
echo "=== mma kernel tests ($(left) s left)" | tee -a "$OUT/log"
ELPIS_KERNEL_LOG="$OUT/log" timeout -k 3 60 python3 -m pytest -m gpu tests/kernels/test_tree_attention_mma.py -q \
  -p no:cacheprovider -rfEs --tb=short > "$OUT/mma_pytest.txt" 2>&1
echo "mma tests exit $?" | tee -a "$OUT/log"
grep -E "passed|failed|^FAILED|^E " "$OUT/mma_pytest.txt" | tail -6 | tee -a "$OUT/log"
wait_synth
echo "=== tree graph tests, full size ($(left) s left)" | tee -a "$OUT/log"
ELPIS_SMALL_DIR=/tmp/full ELPIS_TREE_LOG="$OUT/log" timeout -k 3 150 python3 -m pytest -m gpu \
  tests/exl3/test_tree_graph.py -q -p no:cacheprovider -rfEs --tb=short --durations=8 > "$OUT/graph_pytest.txt" 2>&1
echo "graph tests exit $?" | tee -a "$OUT/log"
grep -E "passed|failed|^FAILED|^E |s call|Error" "$OUT/graph_pytest.txt" | tail -24 | tee -a "$OUT/log"
( source elpis/bench/scripts/device_part_treebench.sh ) 2>&1 | tail -5
echo "=== 24 GiB, tree-16 with graphs, 262K ($(left) s left)" | tee -a "$OUT/log"
if [ "$(left)" -gt 110 ]; then
  ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft timeout -k 3 $(( $(left) - 10 )) \
    python3 -m pytest -m gpu "tests/exl3/test_gpu.py::test_24gib_budget_full_model[tree-16]" -q -s \
    -p no:cacheprovider -rfEs --tb=short > "$OUT/gib24_pytest.txt" 2>&1
  echo "24 GiB tree-16 exit $?" | tee -a "$OUT/log"
  grep -E "\"24gib\"|passed|failed|^E " "$OUT/gib24_pytest.txt" | tail -8 | tee -a "$OUT/log"
fi
if [ "$(left)" -gt 80 ]; then
  echo "=== round sync diag, graphs ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 3 $(( $(left) - 8 )) python3 elpis/bench/scripts/round_sync_diag.py /tmp/full/target /tmp/full/draft \
    > "$OUT/syncdiag.txt" 2>&1
  grep "^SYNCDIAG" "$OUT/syncdiag.txt" | cut -c1-400 >> "$OUT/log"
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
