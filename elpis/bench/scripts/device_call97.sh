#!/bin/bash
# Call 97 (session 23): the tree-verify attention's graded split layout (bend/verify_schedule.bend: a split every
# 128 positions below 4096, 256 below 16384, 512 beyond; proved, emulated on the CPU).
# 1. the model gate under the rule pre-registered for it, exl3-small-tree-r2 (candidate: the served tree mode,
#    gdn-ba + gdn-state-fp32 + rows-gemm + tree-verify at this checkout's code; floors: elpis's chain path and
#    stock's chain verify); the verdict is filed afterwards on the development machine;
# 2. GPU tests of the attention kernels (tensor-core, quantized-cache SIMT, fp16 SIMT: row invariance against
#    plain decoding across the layout's boundaries, fp64 error) and of tree verifies and their graphs;
# 3. attention_splits.py: the served kernel against the previous layout's build (.device/schedule-512, rendered
#    from eba0e79's bend/), graph form, 1K-262K, 8 and 16 rows.
# The full-size checkpoints are made in the background for call 98 (the round bench), run right after on the
# same machine. Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
timeout -k 3 90 python3 -m elpis.cli dequantize --model /tmp/small/target --out /tmp/small-deq > /tmp/deq.log 2>&1
tail -1 /tmp/deq.log | tee -a "$OUT/log"
code=$(python3 -c "from elpis.exl3.gate import code_digest; print(code_digest(['gdn-ba', 'rows-gemm', 'tree-verify']))")
ELPIS_PATCH_ROWS_GEMM=1 ELPIS_PATCH_GDN_BA=1 model_gate tree-r2 \
  "floor-chain=exl3:patches=fixed-rows-8+gdn-state-fp32,rows=8" \
  "floor-stock=exl3:patches=none,rows=8" \
  "tree-graded=exl3:code=$code,patches=gdn-ba+gdn-state-fp32+rows-gemm+tree-verify,rows=8"
gpu_pytest "attention kernels, tree verify and graphs" 260 tests/kernels/test_tree_attention_mma.py \
  tests/kernels/test_tree_attention_qcache.py tests/kernels/test_tree_attention.py tests/exl3/test_tree_verify.py \
  tests/exl3/test_tree_graph.py
echo "=== attention layouts ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 $(( $(left) - 8 )) python3 elpis/bench/scripts/attention_splits.py "$OUT/attention-layouts.json" \
  previous=.device/schedule-512 2>&1 | grep -E '^\{|Error' | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
