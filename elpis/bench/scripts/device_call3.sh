#!/bin/bash
# Call 3: GPU tests with the fp32 Gated DeltaNet state default, then elpis alone on the full model.
LIMIT=248
source elpis/bench/scripts/device_common.sh
( python3 -m elpis.cli synth --full /tmp/full/target && python3 -m elpis.cli synth --draft /tmp/full/draft ) > /tmp/synth_full.log 2>&1 &
SYNTH=$!
python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1
ELPIS_SMALL_DIR=/tmp/small timeout 95 python3 -m pytest -m gpu tests/exl3 -q -p no:cacheprovider -k "not 24gib and not restart" \
  2>&1 | tail -25 | tee -a "$OUT/log"
wait $SYNTH
timeout $(( $(left) - 4 )) python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft --systems elpis \
  --stem engine-2026-11-30-NVIDIA_H200-elpis-fp32state --out-dir "$OUT" --rounds 16 --warmup 3 --elpis-loop direct \
  --time-limit $(( $(left) - 10 )) 2>&1 | grep -v "it/s\]$" | tail -30 | tee -a "$OUT/log"
