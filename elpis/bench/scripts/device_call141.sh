#!/bin/bash
# Call 141 (staged in session 33 for the next session; needs .device/ext.so.xz.part-*, see device_common.sh): the
# served configuration with the Hadamard fold on by default (registry switch exl3-attn-hadamard-fold; gate
# exl3-small-tree-r4 PASS, call 139).
# 1. the 24 GiB test at 262,000 tokens, tree-16 with graphs, fold on (call 138 ran it without the fold; the fold
#    allocates the same shared memory and workspace, test_fold_needs_no_more_memory);
# 2. the round at 1K and 8K, stock in the same run (call 131 without the fold: 17.50 / 18.27 against 24.42 /
#    25.41 ms), if the time allows.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_full_synth
python3 -c "from elpis.exl3 import tree_attention as ta; print('fold on:', ta.hadamard_fold_default())" \
  | tee -a "$OUT/log"
gib24_test "tree-16, Hadamard fold on (served default)" 230
export BENCH_MARGIN=10
[ "$(left)" -gt 150 ] && engine_bench round-1k8k-fold 1 stock,elpis-tree16 8 2 "elpis tree-16, Hadamard fold on, H200"
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
