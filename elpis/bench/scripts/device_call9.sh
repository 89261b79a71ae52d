#!/bin/bash
# Call 9 (session 4, fresh machine): the tensor-core tree attention (tree_attention_mma) in tree mode.
#  1. build (background) and the full-size synthetic checkpoints (/tmp/full/{target,draft});
#  2. tests/kernels/test_tree_attention_mma.py: row invariance against plain decoding on ExLlamaV3-written
#     pages (1K, 32K), error vs fp64 next to the SIMT build, timing at 32K/128K;
#  3. part tree on the full-size model: tree-mode losslessness and row invariance through the mma kernel;
#  4. part treebench: stock chain-8 vs elpis chain-8 vs tree-8 vs tree-16 at 1K/8K/32K/128K.
# Run with ELPIS_GIT_REVISION set (the machine's .git is stale). Results under $OUT.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
echo "=== mma kernel tests ($(left) s left)" | tee -a "$OUT/log"
ELPIS_KERNEL_LOG="$OUT/log" timeout -k 3 40 python3 -m pytest -m gpu tests/kernels/test_tree_attention_mma.py -q -k timing \
  -p no:cacheprovider -rfEs --tb=short > "$OUT/mma_timing.txt" 2>&1
echo "mma timing exit $?" | tee -a "$OUT/log"
ELPIS_KERNEL_LOG="$OUT/log" timeout -k 3 90 python3 -m pytest -m gpu tests/kernels/test_tree_attention_mma.py -q -k "not timing" \
  -p no:cacheprovider -rfEs --tb=short --durations=5 > "$OUT/mma_pytest.txt" 2>&1
echo "mma tests exit $?" | tee -a "$OUT/log"
grep -E "passed|failed|^FAILED|^E " "$OUT/mma_pytest.txt" | tail -12 | tee -a "$OUT/log"
wait_synth
export ELPIS_SMALL_DIR=/tmp/full
part tree
part treebench
save_caches >/dev/null
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
