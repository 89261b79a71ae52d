#!/bin/bash
# Call 46 (issue 9, session 12): call 45's model gate part alone, on the machine call 45 left warm (its build,
# /tmp/small and /tmp/small-deq), with the registry patch switched on. Run with run(carry=[".whl", ".device"]).
source elpis/bench/scripts/device_common.sh
export ELPIS_PATCH_ROWS_GEMM=1
CODE=$(python3 -c "from elpis.exl3.gate import code_digest; print(code_digest(['rows-gemm']))")
echo "code=$CODE"
mkdir -p "$OUT/gate"
ref="device=cuda:0,model=/tmp/small-deq,path=prefill"
timeout -k 3 200 python3 -m elpis.cli gate model --model /tmp/small/target --random-ids 32768 \
  --label rows-gemm-grouped-code-small --results "$OUT/gate" --wikitext-chunks 8 --wikitext-tokens 512 --gsm8k 0 \
  --aime 0 --greedy-prompts 0 --reference "reference:dtype=fp64,$ref" \
  --arm "floor-tree=exl3:patches=gdn-state-fp32+tree-verify,rows=8" \
  --arm "floor-stock=exl3:patches=none,rows=8" \
  --arm "rows-gemm=exl3:code=$CODE,patches=gdn-state-fp32+rows-gemm+tree-verify,rows=8" \
  2>&1 | grep -v "^\s*$" | tail -16 | tee -a "$OUT/log"
ls -la "$OUT/gate"
