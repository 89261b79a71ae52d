#!/bin/bash
# Call 45 (issue 9, session 12): the model gate of the grouped rows GEMM again, now that a configuration naming
# rows-gemm carries code=<digest of its kernel sources> (call 42 measured the same build under the spec of
# session 10's build, which the ledger counts as measured before the rule exl3-small-rows-gemm-r2). Same arms
# and corpus as call 42. Run with run(carry=[".whl", ".device"]). Afterwards, on the CPU machine: copy
# $OUT/gate/model-*.{json,npz} and the ledger lines to bench/results/gate/, then elpis gate verdict.
LIMIT=${LIMIT:-400}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
timeout -k 3 90 python3 -m elpis.cli dequantize --model /tmp/small/target --out /tmp/small-deq > /tmp/deq.log 2>&1
tail -1 /tmp/deq.log | tee -a "$OUT/log"
CODE=$(python3 -c "from elpis.exl3.gate import code_digest; print(code_digest(['rows-gemm']))")
echo "rows-gemm code=$CODE" | tee -a "$OUT/log"
mkdir -p "$OUT/gate"
ref="device=cuda:0,model=/tmp/small-deq,path=prefill"
timeout -k 3 $(( $(left) - 20 )) python3 -m elpis.cli gate model --model /tmp/small/target --random-ids 32768 \
  --label rows-gemm-grouped-code-small --results "$OUT/gate" --wikitext-chunks 8 --wikitext-tokens 512 --gsm8k 0 \
  --aime 0 --greedy-prompts 0 --reference "reference:dtype=fp64,$ref" \
  --arm "floor-tree=exl3:patches=gdn-state-fp32+tree-verify,rows=8" \
  --arm "floor-stock=exl3:patches=none,rows=8" \
  --arm "rows-gemm=exl3:code=$CODE,patches=gdn-state-fp32+rows-gemm+tree-verify,rows=8" \
  2>&1 | grep -v "^\s*$" | tail -24 | tee -a "$OUT/log"
ls -la "$OUT/gate" | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
