#!/bin/bash
# Call 2: the full-size synthetic checkpoints (drawn on the GPU, written to local disk), then
# `elpis bench engine`: stock ExLlamaV3 and elpis (under the 24 GiB cap) in the same run.
LIMIT=590
source elpis/bench/scripts/device_common.sh
free -g | head -2 | tee -a "$OUT/log"; df -h /tmp | tail -1 | tee -a "$OUT/log"
( time python3 -m elpis.cli synth --full /tmp/full/target && time python3 -m elpis.cli synth --draft /tmp/full/draft ) 2>&1 \
  | grep -v "^synth" | tail -8 | tee -a "$OUT/log"
du -sh /tmp/full/* | tee -a "$OUT/log"
timeout $(( $(left) - 10 )) python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
  --out-dir "$OUT" --time-limit $(( $(left) - 25 )) 2>&1 | tail -80 | tee -a "$OUT/log"
save_caches
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
