#!/bin/bash
# Call 6 (session 3, first call): the committed tree only (helpers' uncommitted edits set aside), then
#  1. `elpis build` (proven acceptor for this Python) alongside the small and full synthetic checkpoints;
#  2. re-runs of last session's GPU evidence taken on code changed since: the device acceptor's full table
#     (generated C now without recursion) and the GDN tree kernel (proved visiting plan);
#  3. the exl3 gate configurations' GPU tests (served path, path=forward, narrower head);
#  4. issue 7: stock ExLlamaV3 and elpis against the fp64 evaluation of the same synthetic weights
#     (`elpis dequantize` + `elpis gate model --random-ids`), numerical drift only;
#  5. issues 9/10 item 1: `elpis bench profile` (stock vs elpis, per-phase GPU time) on the full-size model.
# Results under $OUT (log, gate/, profile/); caches for the next machine.
LIMIT=${LIMIT:-565}
T0=$(date +%s)
if [ -d .git ]; then
  git config --global --add safe.directory "$PWD" >/dev/null 2>&1
  git stash push -u -q -m device >/dev/null 2>&1
  echo "tree: HEAD $(git rev-parse --short HEAD), uncommitted edits set aside: $(git stash list | wc -l)"
else
  echo "tree: no .git, running the working tree as sent"
fi
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
export ELPIS_PROVE_JOBS=14
( time python3 -m elpis.cli build ) >/tmp/build.log 2>&1 &
BUILD=$!
python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1
( python3 -m elpis.cli synth --full /tmp/full/target && python3 -m elpis.cli synth --draft /tmp/full/draft ) \
  >/tmp/synth_full.log 2>&1 &
SYNTH=$!
wait $BUILD
tail -4 /tmp/build.log | tee -a "$OUT/log"
export ELPIS_SMALL_DIR=/tmp/small
part accept
part gdntree
echo "=== gate configurations ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 60 python3 -m pytest -m gpu tests/exl3/test_gate_provider.py -q -p no:cacheprovider -rfEs \
  -k "teacher_forces or narrower or forward_configuration" 2>&1 | tail -12 | tee -a "$OUT/log"
echo "=== gate model on the small synthetic model ($(left) s left)" | tee -a "$OUT/log"
mkdir -p "$OUT/gate"
timeout -k 3 60 python3 -m elpis.cli dequantize --model /tmp/small/target --out /tmp/small-deq 2>&1 | tail -3 \
  | tee -a "$OUT/log"
gate_model() {  # device of the fp64/fp32 reference configurations
  local dev=$1 ref="model=/tmp/small-deq,path=prefill"
  [ "$dev" = cpu ] || ref="device=$dev,$ref"
  timeout -k 3 150 python3 -m elpis.cli gate model --model /tmp/small/target --random-ids 32768 \
    --label "small-synthetic-$dev" --results "$OUT/gate" --wikitext-chunks 6 --wikitext-tokens 256 --gsm8k 0 \
    --aime 0 --greedy-prompts 2 --greedy-tokens 64 --reference "reference:dtype=fp64,$ref" \
    --arm "floor-fp32-prefill=reference:dtype=fp32,$ref" \
    --arm "stock=exl3:patches=none" --arm "stock-plain=exl3:patches=none,rows=1" \
    --arm "elpis=exl3:patches=fixed-rows-8+gdn-state-fp32" --arm "elpis-16=exl3:patches=gdn-state-fp32,rows=16" \
    2>&1 | grep -v "^\s*$" | tail -30 | tee -a "$OUT/log"
  return "${PIPESTATUS[0]}"
}
if [ -d /tmp/small-deq ]; then
  gate_model cuda:0 || { echo "gate model with the reference on cuda:0 failed; again on cpu" | tee -a "$OUT/log"; gate_model cpu; }
fi
wait $SYNTH
tail -2 /tmp/synth_full.log | tee -a "$OUT/log"
echo "=== profile ($(left) s left)" | tee -a "$OUT/log"
if [ "$(left)" -gt 150 ]; then
  timeout -k 5 $(( $(left) - 25 )) python3 -m elpis.cli bench profile --model /tmp/full/target \
    --draft /tmp/full/draft --out-dir "$OUT/profile" --time-limit $(( $(left) - 40 )) \
    --checkpoints 1024,32768 --profile-prefill 32768 2>&1 | grep -v "it/s\]$" | tail -40 | tee -a "$OUT/log"
fi
save_caches >/dev/null
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
