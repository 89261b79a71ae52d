#!/bin/bash
# Call 42 (issue 9, session 11): the grouped build of elpis's 1-16-row EXL3 GEMM (one kernel call per group of
# projections sharing an input) and its 6-bit decode (the output head) on the small model: the kernel's and the
# patch's GPU tests, tree-mode lossless tests with ELPIS_PATCH_ROWS_GEMM=1, where the patch reaches,
# rows_gemm_check.py on every Qwen3.8 shape (the head included) and group, the model gate under the rule
# exl3-small-rows-gemm-r2 (committed before this call), then the op gate (part gate).
# Run with run(carry=[".whl", ".device"]). Afterwards, on the CPU machine: copy $OUT/gate/model-*.{json,npz} to
# bench/results/gate/ and run elpis gate verdict --rules elpis/gate/rules/exl3-small-rows-gemm-r2.toml ...
LIMIT=${LIMIT:-580}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
export ELPIS_PATCH_ROWS_GEMM=1
build_and_small_synth
( timeout -k 3 90 python3 -m elpis.cli dequantize --model /tmp/small/target --out /tmp/small-deq ) > /tmp/deq.log 2>&1 &
DEQ=$!
export ELPIS_SMALL_DIR=/tmp/small
gpu_pytest "rows GEMM kernel and patch tests" 150 tests/kernels/test_rows_gemm.py tests/exl3/test_rows_gemm_patch.py
gpu_pytest "tree mode lossless with the kernel" 150 tests/exl3/test_tree_verify.py \
  -k "invariant or lossless or product_path"
echo "=== reach ($(left) s left)" | tee -a "$OUT/log"
timeout 90 python3 elpis/bench/scripts/rows_gemm_reach.py /tmp/small 2>&1 | tail -3 | tee -a "$OUT/log"
echo "=== rows_gemm_check ($(left) s left)" | tee -a "$OUT/log"
timeout 150 python3 elpis/bench/scripts/rows_gemm_check.py "$OUT/rows_gemm.json" 2>&1 | tail -32 | tee -a "$OUT/log"
wait $DEQ; tail -2 /tmp/deq.log | tee -a "$OUT/log"
mkdir -p "$OUT/gate"
ref="device=cuda:0,model=/tmp/small-deq,path=prefill"
echo "=== gate model, rows-gemm grouped ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 $(( $(left) - 60 )) python3 -m elpis.cli gate model --model /tmp/small/target --random-ids 32768 \
  --label rows-gemm-grouped-small --results "$OUT/gate" --wikitext-chunks 8 --wikitext-tokens 512 --gsm8k 0 \
  --aime 0 --greedy-prompts 0 --reference "reference:dtype=fp64,$ref" \
  --arm "floor-tree=exl3:patches=gdn-state-fp32+tree-verify,rows=8" \
  --arm "floor-stock=exl3:patches=none,rows=8" \
  --arm "rows-gemm=exl3:patches=gdn-state-fp32+rows-gemm+tree-verify,rows=8" \
  2>&1 | grep -v "^\s*$" | tail -30 | tee -a "$OUT/log"
part gate
ls -la "$OUT/gate" | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
