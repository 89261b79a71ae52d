#!/bin/bash
# Call 22 (prepared in session 7, for the next session): the quality-gate measurement for the patch
# prefill-chunk-8192 (issue 10), under the rule elpis/gate/rules/exl3-small-prefill-r1.toml (committed before
# any measurement of it). Run with run(carry=[".whl", ".device"]); ~4 min.
#  1. `elpis build`, the small synthetic model (/tmp/small) and its dequantised copy (/tmp/small-deq, the
#     fp64 / fp32 references);
#  2. `elpis gate model --score-from 8192`: 6 documents of 8,448 pseudo-random ids; every configuration
#     prefills the first 8,192 its own way, then the 256 positions after are compared against fp64:
#     floors (the rule's): the served path as shipped (2048-token chunks) and the fp32 reference prefill;
#     candidate: the same served path with 8192-token chunks.
# Afterwards, on the CPU machine: copy $OUT/gate/model-*.{json,npz} to bench/results/gate/, append the
# ledger lines, then
#   elpis gate verdict --rules elpis/gate/rules/exl3-small-prefill-r1.toml \
#     --measurement bench/results/gate/model-prefill-chunk-....json --candidate chunk8192 --patch prefill-chunk-8192
# (the rule-age check reads git, which the device copy may lack).
LIMIT=${LIMIT:-400}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log | tee -a "$OUT/log"; exit 1; }
timeout -k 2 60 python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1 | tee -a "$OUT/log"
timeout -k 3 60 python3 -m elpis.cli dequantize --model /tmp/small/target --out /tmp/small-deq 2>&1 | tail -2 \
  | tee -a "$OUT/log"
mkdir -p "$OUT/gate"
ref="device=cuda:0,model=/tmp/small-deq,path=prefill"
echo "=== gate model, score from 8192 ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 $(( $(left) - 10 )) python3 -m elpis.cli gate model --model /tmp/small/target --random-ids 32768 \
  --label prefill-chunk-small --results "$OUT/gate" --wikitext-chunks 6 --wikitext-tokens 8448 --gsm8k 0 \
  --aime 0 --greedy-prompts 0 --score-from 8192 --reference "reference:dtype=fp64,$ref" \
  --arm "floor-served=exl3:patches=fixed-rows-8+gdn-state-fp32,rows=8" \
  --arm "floor-fp32-prefill=reference:dtype=fp32,$ref" \
  --arm "chunk8192=exl3:patches=fixed-rows-8+gdn-state-fp32+prefill-chunk-8192,rows=8" \
  2>&1 | grep -v "^\s*$" | tail -30 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
