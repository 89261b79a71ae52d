#!/bin/bash
# Call 139 (session 33): the tree attention with the cache's Hadamard rotation folded into its queries and
# outputs (registry switch exl3-attn-hadamard-fold, build define ELPIS_MMA_HADAMARD_FOLD; off by default).
# 1. The fold build timed beside the served build at 32K-262K, 1, 8 and 16 rows (mma_vs_previous.py with a copy
#    of the source that defines the switch, .device/fold/: "previous" is the fold; its bits differ by design, so
#    the bits lines report differences);
# 2. the model gate under the rule pre-registered for it, exl3-small-tree-r4 (candidate: the served tree mode
#    plus the fold, at this checkout's code, in a process with the switch on; floors: elpis's chain path and
#    stock's chain verify); the verdict is filed afterwards on the development machine;
# 3. GPU tests: the attention kernel's (row invariance, staging and error, with and without the fold), then tree
#    verify and its graphs on the small model with the switch on (speculation against plain decoding).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-570}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
mkdir -p .device/fold
{ echo "#define ELPIS_MMA_HADAMARD_FOLD 1"; cat patches/kernels/tree_attention_mma.cu; } > .device/fold/tree_attention_mma.cu
cp patches/kernels/tree_attention_common.cuh .device/fold/
echo "=== attention: served against the fold ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 80 python3 elpis/bench/scripts/mma_vs_previous.py .device/fold/tree_attention_mma.cu 32760 131050 262128 \
  2>&1 | tee "$OUT/mma-vs-fold.txt" | grep -E 'timing|failures|Error' | tee -a "$OUT/log"
timeout -k 3 90 python3 -m elpis.cli dequantize --model /tmp/small/target --out /tmp/small-deq > /tmp/deq.log 2>&1
tail -1 /tmp/deq.log | tee -a "$OUT/log"
code=$(python3 -c "from elpis.exl3.gate import code_digest
print(code_digest(['exl3-attn-hadamard-fold', 'gdn-ba', 'rows-gemm', 'tree-verify']))")
ELPIS_PATCH_ATTN_HADAMARD_FOLD=1 ELPIS_PATCH_ROWS_GEMM=1 ELPIS_PATCH_GDN_BA=1 model_gate tree-r4 \
  "floor-chain=exl3:patches=fixed-rows-8+gdn-state-fp32,rows=8" \
  "floor-stock=exl3:patches=none,rows=8" \
  "tree-fold=exl3:code=$code,patches=exl3-attn-hadamard-fold+gdn-ba+gdn-state-fp32+rows-gemm+tree-verify,rows=8"
gpu_pytest "attention kernel GPU tests" 120 tests/kernels/test_tree_attention_mma.py
ELPIS_PATCH_ATTN_HADAMARD_FOLD=1 ELPIS_SMALL_DIR=/tmp/small gpu_pytest "tree verify and graphs with the fold" \
  $(( $(left) - 10 )) tests/exl3/test_tree_verify.py tests/exl3/test_tree_graph.py
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
