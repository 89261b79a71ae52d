#!/bin/bash
# Call 2: the full-size synthetic checkpoints (drawn on the GPU, written to local disk) in the background
# while the GPU tests run on the --small model; then `elpis bench engine`: stock ExLlamaV3 and elpis (under
# the 24 GiB cap, 262,000-token prefill + 128 decoded tokens at the last checkpoint) in the same run.
LIMIT=588
ELPIS_LOOP=${ELPIS_LOOP:-direct}
source elpis/bench/scripts/device_common.sh
( python3 -m elpis.cli synth --full /tmp/full/target && python3 -m elpis.cli synth --draft /tmp/full/draft ) \
  > /tmp/synth_full.log 2>&1 &
SYNTH=$!
python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1 | tee -a "$OUT/log"
ELPIS_SMALL_DIR=/tmp/small timeout 175 python3 -m pytest -m gpu tests/exl3 -q -p no:cacheprovider -k "not 24gib" \
  2>&1 | tail -40 | tee -a "$OUT/log"
wait $SYNTH; tail -2 /tmp/synth_full.log | tee -a "$OUT/log"; du -sh /tmp/full/* | tee -a "$OUT/log"
echo "bench starts at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
timeout $(( $(left) - 8 )) python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
  --out-dir "$OUT" --rounds 16 --warmup 3 --elpis-loop $ELPIS_LOOP --time-limit $(( $(left) - 22 )) 2>&1 \
  | grep -v "it/s\]$" | tail -70 | tee -a "$OUT/log"
save_caches
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
