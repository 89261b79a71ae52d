#!/bin/bash
# Call 83 (session 20): the tree attention's split size (bend/verify_schedule.bend split_shift(): 9, 512
# positions) against 7 and 8 (128 and 256), with `attention_splits.py`: the served graph form at 1K-262K, 8 and
# 16 rows, time per call and the output's difference from the served build. No `make build` on the device:
# run with run(carry=[".whl", ".device", "build/kernels"]) (the generated schedule headers come along).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
echo "=== attention split sizes ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 10 )) python3 elpis/bench/scripts/attention_splits.py "$OUT/splits.json" 7 8 2>&1 \
  | grep -vE "^\s*$" | tail -20 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
