#!/bin/bash
# Call 5 (one bundled call, ~5 minutes of device time left in the session): build the proven acceptor on
# the GPU machine, then, in priority order, each part's GPU checks, each bounded by the time left.
LIMIT=${LIMIT:-262}
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
export ELPIS_PROVE_JOBS=14
( time python3 -m elpis.cli build ) 2>&1 | tail -4 | tee -a "$OUT/log"
python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1
export ELPIS_SMALL_DIR=/tmp/small
part() {  # name, seconds: run one part's script if at least that much time is left
  local name=$1 need=$2
  if [ "$(left)" -lt "$need" ]; then echo "SKIP $name: $(left) s left" | tee -a "$OUT/log"; return; fi
  echo "=== $name ($(left) s left)" | tee -a "$OUT/log"
  ( source "elpis/bench/scripts/device_part_$name.sh" ) 2>&1 | tail -40
}
part accept 25
echo "=== product path ($(left) s left)" | tee -a "$OUT/log"
timeout $(( $(left) > 80 ? 80 : $(left) - 5 )) python3 -m pytest -m gpu tests/exl3/test_gpu.py tests/spec -q -p no:cacheprovider \
  -k "not 24gib" -rs --durations=5 2>&1 | tail -15 | tee -a "$OUT/log"
part gdntree 20
part treeattn 25
part gate 25
echo "=== done ($(left) s left)" | tee -a "$OUT/log"
