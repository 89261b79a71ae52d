#!/bin/bash
# Call 36 (issue 9): where the patch exl3-rows-gemm reaches (elpis/bench/scripts/rows_gemm_reach.py: modules that
# keep an ExLlamaV3 C++ block graph, kernel calls per eager chain and tree verify), then the quality-gate
# measurement for the configuration patch rows-gemm under the rule elpis/gate/rules/exl3-small-rows-gemm-r1.toml
# (committed in a9487b1, before any measurement of it). Run with run(carry=[".whl", ".device"]); ~4 min.
# Afterwards, on the CPU machine: copy $OUT/gate/model-*.{json,npz} to bench/results/gate/, then
# elpis gate verdict --rules elpis/gate/rules/exl3-small-rows-gemm-r1.toml --measurement ... --candidate rows-gemm \
#   --patch rows-gemm
LIMIT=${LIMIT:-570}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
export ELPIS_PATCH_ROWS_GEMM=1
( ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build ) > /tmp/build.log 2>&1 &
BUILD=$!
timeout -k 2 60 python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1 | tee -a "$OUT/log"
wait $BUILD || { tail -20 /tmp/build.log | tee -a "$OUT/log"; exit 1; }
timeout -k 3 90 python3 -m elpis.cli dequantize --model /tmp/small/target --out /tmp/small-deq 2>&1 | tail -2 \
  | tee -a "$OUT/log"
echo "=== reach ($(left) s left)" | tee -a "$OUT/log"
timeout 120 python3 elpis/bench/scripts/rows_gemm_reach.py /tmp/small 2>&1 | tail -3 | tee -a "$OUT/log"
mkdir -p "$OUT/gate"
ref="device=cuda:0,model=/tmp/small-deq,path=prefill"
echo "=== gate model, rows-gemm ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 $(( $(left) - 8 )) python3 -m elpis.cli gate model --model /tmp/small/target --random-ids 32768 \
  --label rows-gemm-small --results "$OUT/gate" --wikitext-chunks 8 --wikitext-tokens 512 --gsm8k 0 \
  --aime 0 --greedy-prompts 0 --reference "reference:dtype=fp64,$ref" \
  --arm "floor-tree=exl3:patches=gdn-state-fp32+tree-verify,rows=8" \
  --arm "floor-stock=exl3:patches=none,rows=8" \
  --arm "rows-gemm=exl3:patches=gdn-state-fp32+rows-gemm+tree-verify,rows=8" \
  2>&1 | grep -v "^\s*$" | tail -30 | tee -a "$OUT/log"
ls -la "$OUT/gate" | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
