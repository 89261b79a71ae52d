#!/bin/bash
# Call 127 (session 30): where a tile of the tree attention spends its time at long contexts, with the kernel as
# served since session 24 (graded splits, 2048 positions past 65536). At 262K the attention is ~26 ms of a 43.6 ms
# tree-16 round (call 108) against a 3-bit cache read of ~40 us a layer; the last phase clocks (call 21) were at
# 128K before the split changes. mma_phase_clocks.py at 128K and 262K, 1 / 8 / 16 rows.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-280}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log | tee -a "$OUT/log"; exit 1; }
echo "=== phase clocks ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 10 )) python3 elpis/bench/scripts/mma_phase_clocks.py 131056 262128 2>&1 | grep -v Warning \
  | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
