#!/bin/bash
# Call 7 (session 3, warm machine after call 6): issue 7 items 4-5 on SmolLM2 and issue 8's first GPU run.
#  - the SmolLM2 GGUF arrives in two carried parts (.smolA in the previous call, copied to /tmp/smolparts;
#    .smolB now), is reassembled and checked against its pinned SHA-256 (ensure_smollm2 on the cache dir);
#  - `elpis export-hf` (exact fp32 weights) -> `elpis quantize` (ExLlamaV3's converter, 4.00 bpw, 6 bpw head)
#    -> `elpis gate model`: the fp64 reference on the original against the EXL3 4-bit model (quantization
#    cost, stock ExLlamaV3 forward) and fp32 floors, on WikiText-2 / GSM8K / AIME text;
#  - the acceptor rebuilt in the background (sources changed since call 6), then issue 8's device part.
LIMIT=${LIMIT:-585}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
export ELPIS_PROVE_JOBS=12 ELPIS_SMALL_DIR=/tmp/small
TREE=${TREE:-1}  # TREE=0: the SmolLM2 part only
if [ "$TREE" = 1 ]; then
  ( python3 -m elpis.cli build >/tmp/build7.log 2>&1; echo "build rc=$?" >>/tmp/build7.log ) &
  BUILD=$!
fi
mkdir -p /tmp/c/smollm2 "$OUT/gate"
cat /tmp/smolparts/a .smolB/part > /tmp/c/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF=$(python3 -c "from pathlib import Path; from elpis.reference.assets import ensure_smollm2; print(ensure_smollm2(Path('/tmp/c')))") \
  || { echo "SmolLM2 GGUF failed its check" | tee -a "$OUT/log"; }
echo "gguf: $GGUF" | tee -a "$OUT/log"
( time python3 -m elpis.cli export-hf --gguf "$GGUF" --out /tmp/smol-hf ) 2>&1 | tail -4 | tee -a "$OUT/log"
( time timeout -k 5 300 python3 -m elpis.cli quantize --model /tmp/smol-hf --out /tmp/smol-exl3 --work /tmp/smol-work ) \
  >/tmp/quant.log 2>&1
grep -v "^\s*$" /tmp/quant.log | grep -iv "it/s\]" | tail -15 | tee -a "$OUT/log"
cp /tmp/quant.log "$OUT/quantize-smollm2.log" 2>/dev/null
if [ -f /tmp/smol-exl3/config.json ]; then
  cp /tmp/smol-exl3/config.json "$OUT/smollm2-exl3-config.json"
  timeout -k 3 200 python3 -m elpis.cli gate model --model "$GGUF" --label smollm2-exl3-h200 --results "$OUT/gate" \
    --reference "reference:dtype=fp64,path=prefill" \
    --arm "floor-fp32-prefill=reference:dtype=fp32,path=prefill" \
    --arm "floor-fp32-decode=reference:dtype=fp32,mode=exact,path=verify,rows=16" \
    --arm "exl3-4bpw=exl3:path=forward,model=/tmp/smol-exl3" 2>&1 | grep -v "^\s*$" | tail -24 | tee -a "$OUT/log"
fi
if [ "$TREE" = 1 ]; then
  wait $BUILD
  tail -3 /tmp/build7.log | tee -a "$OUT/log"
  echo "=== tree ($(left) s left)" | tee -a "$OUT/log"
  ( source elpis/bench/scripts/device_part_tree.sh ) 2>&1 | tail -60
fi
save_caches >/dev/null
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
