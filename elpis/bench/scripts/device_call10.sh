#!/bin/bash
# Call 10 (session 4, fresh machine): the last device call of the session, on the tensor-core tree attention
# with padded Q and row-fastest V staging.
#  1. build (background) and the full-size synthetic checkpoints;
#  2. tests/kernels/test_tree_attention_mma.py: invariance, fp64 error, timing against the SIMT build;
#  3. tests/exl3/test_tree_verify.py on the full-size model (tree-mode losslessness through this kernel);
#  4. the 24 GiB test in tree mode: 262,000-token prefill + 128 tokens, every verify a 16-row tree;
#  5. part treebench (stock chain-8 vs elpis chain-8 vs tree-8 vs tree-16, 1K..128K) if time is left.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
echo "=== mma kernel tests ($(left) s left)" | tee -a "$OUT/log"
ELPIS_KERNEL_LOG="$OUT/log" timeout -k 3 90 python3 -m pytest -m gpu tests/kernels/test_tree_attention_mma.py -q \
  -p no:cacheprovider -rfEs --tb=short --durations=5 > "$OUT/mma_pytest.txt" 2>&1
echo "mma tests exit $?" | tee -a "$OUT/log"
grep -E "passed|failed|^FAILED|^E " "$OUT/mma_pytest.txt" | tail -8 | tee -a "$OUT/log"
wait_synth
echo "=== tree verify tests, full size ($(left) s left)" | tee -a "$OUT/log"
ELPIS_SMALL_DIR=/tmp/full ELPIS_TREE_LOG="$OUT/log" timeout -k 3 120 python3 -m pytest -m gpu \
  tests/exl3/test_tree_verify.py -q -p no:cacheprovider -rfEs --tb=short --durations=5 > "$OUT/tree_pytest.txt" 2>&1
echo "tree tests exit $?" | tee -a "$OUT/log"
grep -E "passed|failed|^FAILED|^E " "$OUT/tree_pytest.txt" | tail -8 | tee -a "$OUT/log"
echo "=== 24 GiB, tree-16, 262K ($(left) s left)" | tee -a "$OUT/log"
ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft timeout -k 3 $(( $(left) - 160 )) \
  python3 -m pytest -m gpu "tests/exl3/test_gpu.py::test_24gib_budget_full_model[tree-16]" -q -s \
  -p no:cacheprovider -rfEs --tb=short > "$OUT/gib24_pytest.txt" 2>&1
echo "24 GiB tree-16 exit $?" | tee -a "$OUT/log"
grep -E "\"24gib\"|passed|failed|^E " "$OUT/gib24_pytest.txt" | tail -8 | tee -a "$OUT/log"
( source elpis/bench/scripts/device_part_treebench.sh ) 2>&1 | tail -5
save_caches >/dev/null
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
