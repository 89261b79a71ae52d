#!/bin/bash
# Call 105 (session 24): 2048-position attention splits past 65536 (bend/verify_schedule.bend; proved, header
# and CPU references from the program; below 65536 the layout is session 23's).
# 1. the model gate under the rule pre-registered for it, exl3-small-tree-r3: every arm prefills each document's
#    first 65,536 tokens its own way and is teacher-forced over the next 2,304 (candidate: the served tree mode at
#    this checkout's code; floors: elpis's chain path and stock's chain verify); the verdict is filed afterwards
#    on the development machine;
# 2. GPU tests of the attention kernels (tensor-core, quantized-cache SIMT, fp16 SIMT: row invariance against
#    plain decoding across the layout's boundaries, 65536 and 69632 included; fp64 error);
# 3. attention_splits.py: the served kernel against session 23's layout (.device/schedule-r2, rendered from
#    c728a8b's bend/), graph form, 1K-262K, 8 and 16 rows.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
timeout -k 3 90 python3 -m elpis.cli dequantize --model /tmp/small/target --out /tmp/small-deq > /tmp/deq.log 2>&1
tail -1 /tmp/deq.log | tee -a "$OUT/log"
code=$(python3 -c "from elpis.exl3.gate import code_digest; print(code_digest(['gdn-ba', 'rows-gemm', 'tree-verify']))")
echo "=== gate model tree-r3 ($(left) s left)" | tee -a "$OUT/log"
mkdir -p "$OUT/gate"
ELPIS_PATCH_ROWS_GEMM=1 ELPIS_PATCH_GDN_BA=1 timeout -k 3 300 python3 -m elpis.cli gate model \
  --model /tmp/small/target --random-ids 32768 --label tree-r3 --results "$OUT/gate" --wikitext-chunks 4 \
  --wikitext-tokens 67841 --score-from 65536 --gsm8k 0 --aime 0 --greedy-prompts 0 \
  --reference "reference:dtype=fp64,device=cuda:0,model=/tmp/small-deq,path=prefill" \
  --arm "floor-chain=exl3:patches=fixed-rows-8+gdn-state-fp32,rows=8" \
  --arm "floor-stock=exl3:patches=none,rows=8" \
  --arm "tree-long=exl3:code=$code,patches=gdn-ba+gdn-state-fp32+rows-gemm+tree-verify,rows=8" \
  2>&1 | grep -v "^\s*$" | tail -16 | tee -a "$OUT/log"
gpu_pytest "attention kernels" 200 tests/kernels/test_tree_attention_mma.py tests/kernels/test_tree_attention_qcache.py \
  tests/kernels/test_tree_attention.py
echo "=== attention layouts ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 $(( $(left) - 8 )) python3 elpis/bench/scripts/attention_splits.py "$OUT/attention-layouts.json" \
  r2=.device/schedule-r2 2>&1 | grep -E '^\{|Error' | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
