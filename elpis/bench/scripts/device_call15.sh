#!/bin/bash
# Call 15 (session 6): the pipelined tensor-core attention staging and the graph-captured commits.
#  1. build (background) and the full-size synthetic checkpoints (background);
#  2. tensor-core attention tests: the pipelined staging against the direct staging, bit for bit (1K, 32K,
#     128K; 1, 8, 16 rows), row invariance, error against fp64; then, once the synthesis no longer uses the
#     GPU, the timing line (pipelined vs direct vs SIMT at 32K and 128K, 8 and 16 rows);
#  3. tests/exl3/test_tree_graph.py on the full-size model: replays vs eager, commits through graphs vs eager
#     commits, abandon, losslessness through replays at 8 and 16 rows, bounded captures;
#  4. part treebench (tree systems replay graphs by default): stock chain-8 vs elpis chain-8 vs tree-8/16;
#  5. Triton and autotune caches back through $OUT for the next call; the round sync diag if time is left.
# $OUT returns at most 8 files: log, pytest.txt (every pytest and the sync diag), treebench.{json,md,txt},
# caches.tar.xz.part-*.
LIMIT=${LIMIT:-500}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
python3 -c "import exllamav3.ext as e; print('exllamav3 ext', e.exllamav3_ext.__file__)" 2>&1 | tail -1 | tee -a "$OUT/log"
start_build_and_full_synth
wait_build
echo "=== mma kernel tests ($(left) s left)" | tee -a "$OUT/log"
ELPIS_KERNEL_LOG="$OUT/log" timeout -k 3 100 python3 -m pytest -m gpu tests/kernels/test_tree_attention_mma.py \
  -k "not timing" -q -p no:cacheprovider -rfEs --tb=short > "$OUT/pytest.txt" 2>&1
echo "mma tests exit $?" | tee -a "$OUT/log"
grep -E "passed|failed|^FAILED|^E " "$OUT/pytest.txt" | tail -6 | tee -a "$OUT/log"
wait_synth
echo "=== mma timing ($(left) s left)" | tee -a "$OUT/log"
ELPIS_KERNEL_LOG="$OUT/log" timeout -k 3 60 python3 -m pytest -m gpu tests/kernels/test_tree_attention_mma.py \
  -k timing -q -p no:cacheprovider -rfEs --tb=short >> "$OUT/pytest.txt" 2>&1
echo "mma timing exit $?" | tee -a "$OUT/log"
echo "=== tree graph tests, full size ($(left) s left)" | tee -a "$OUT/log"
ELPIS_SMALL_DIR=/tmp/full ELPIS_TREE_LOG="$OUT/log" timeout -k 3 230 python3 -m pytest -m gpu \
  tests/exl3/test_tree_graph.py -q -p no:cacheprovider -rfEs --tb=short --durations=8 >> "$OUT/pytest.txt" 2>&1
echo "graph tests exit $?" | tee -a "$OUT/log"
grep -E "passed|failed|^FAILED|^E |s call|Error" "$OUT/pytest.txt" | tail -24 | tee -a "$OUT/log"
TREEBENCH_MIN=110
( source elpis/bench/scripts/device_part_treebench.sh ) 2>&1 | tail -5
rm -f "$OUT/treebench.png"  # $OUT returns at most 8 files
save_caches > /dev/null 2>&1
if [ "$(left)" -gt 80 ]; then
  echo "=== round sync diag, graphs ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 3 $(( $(left) - 8 )) python3 elpis/bench/scripts/round_sync_diag.py /tmp/full/target /tmp/full/draft \
    >> "$OUT/pytest.txt" 2>&1
  grep "^SYNCDIAG" "$OUT/pytest.txt" | cut -c1-400 >> "$OUT/log"
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
