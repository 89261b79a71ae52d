#!/bin/bash
# Call 13 (session 5): CUDA-graph-captured tree verifies (elpis.exl3.tree_graph).
#  1. build (background) and the full-size synthetic checkpoints;
#  2. tests/exl3/test_tree_graph.py on the full-size model: replays bitwise equal to eager, losslessness
#     through replays at 8 and 16 rows, bounded captures;
#  3. part treebench with --tree-graphs (stock chain-8 vs elpis chain-8 vs tree-8 vs tree-16, replayed);
#  4. tree verify tests (eager) and the tensor-core kernel tests after the kernels' context/plan change.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
wait_synth
echo "=== tree graph tests, full size ($(left) s left)" | tee -a "$OUT/log"
ELPIS_SMALL_DIR=/tmp/full ELPIS_TREE_LOG="$OUT/log" timeout -k 3 170 python3 -m pytest -m gpu \
  tests/exl3/test_tree_graph.py -x -q -p no:cacheprovider -rfEs --tb=short --durations=6 > "$OUT/graph_pytest.txt" 2>&1
echo "graph tests exit $?" | tee -a "$OUT/log"
grep -E "passed|failed|^FAILED|^E |s call|Error" "$OUT/graph_pytest.txt" | tail -24 | tee -a "$OUT/log"
TREEBENCH_EXTRA=--tree-graphs
( source elpis/bench/scripts/device_part_treebench.sh ) 2>&1 | tail -5
echo "=== tree verify + mma kernel tests ($(left) s left)" | tee -a "$OUT/log"
ELPIS_SMALL_DIR=/tmp/full ELPIS_TREE_LOG="$OUT/log" ELPIS_KERNEL_LOG="$OUT/log" timeout -k 3 $(( $(left) - 10 )) \
  python3 -m pytest -m gpu tests/exl3/test_tree_verify.py tests/kernels/test_tree_attention_mma.py tests/kernels/test_gdn_tree.py \
  -q -p no:cacheprovider -rfEs --tb=short > "$OUT/tree_pytest.txt" 2>&1
echo "tests exit $?" | tee -a "$OUT/log"
grep -E "passed|failed|^FAILED|^E " "$OUT/tree_pytest.txt" | tail -10 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
