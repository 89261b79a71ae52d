#!/bin/bash
# Call 30: the quality-gate measurement for the patch tree-verify (tree mode, elpis serve's default with a
# DFlash2 draft) under the rule elpis/gate/rules/exl3-small-tree-r1.toml (committed in c73bb05, before any
# measurement of it). Run with run(carry=[".whl", ".device"]); ~3 min.
#  1. `elpis build`, the small synthetic model (/tmp/small) and its dequantised copy (/tmp/small-deq);
#  2. `elpis gate model`: 8 documents of 512 pseudo-random ids, teacher-forced in chains of 8 rows; floors:
#     the served chain path as shipped before (fixed-rows-8 + gdn-state-fp32) and stock ExLlamaV3's chain
#     verify; candidate: tree mode (gdn-state-fp32 + tree-verify).
# Afterwards, on the CPU machine: copy $OUT/gate/model-*.{json,npz} to bench/results/gate/, append the ledger
# line, then elpis gate verdict --rules elpis/gate/rules/exl3-small-tree-r1.toml --measurement ... \
#   --candidate tree --patch tree-verify
LIMIT=${LIMIT:-270}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log | tee -a "$OUT/log"; exit 1; }
timeout -k 2 60 python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1 | tee -a "$OUT/log"
timeout -k 3 60 python3 -m elpis.cli dequantize --model /tmp/small/target --out /tmp/small-deq 2>&1 | tail -2 \
  | tee -a "$OUT/log"
mkdir -p "$OUT/gate"
ref="device=cuda:0,model=/tmp/small-deq,path=prefill"
echo "=== gate model, tree-verify ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 $(( $(left) - 8 )) python3 -m elpis.cli gate model --model /tmp/small/target --random-ids 32768 \
  --label tree-verify-small --results "$OUT/gate" --wikitext-chunks 8 --wikitext-tokens 512 --gsm8k 0 \
  --aime 0 --greedy-prompts 0 --reference "reference:dtype=fp64,$ref" \
  --arm "floor-served=exl3:patches=fixed-rows-8+gdn-state-fp32,rows=8" \
  --arm "floor-stock=exl3:patches=none,rows=8" \
  --arm "tree=exl3:patches=gdn-state-fp32+tree-verify,rows=8" \
  2>&1 | grep -v "^\s*$" | tail -30 | tee -a "$OUT/log"
ls -la "$OUT/gate" | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
