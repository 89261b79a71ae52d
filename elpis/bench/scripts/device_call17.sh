#!/bin/bash
# Call 17 (session 7): where a tile of the tensor-core tree attention spends its time. Runs
# mma_phase_clocks.py (the ELPIS_MMA_CLOCKS build: cycles per phase of one block's tiles, next to the served
# build's ms per call) at 1K / 8K / 32K / 128K with 1, 8 and 16 rows. The acceptor and the proven schedule
# headers it needs are built there first (`elpis build`, ~70 s): run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-300}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
timeout -k 5 $(( $(left) - 10 )) python3 elpis/bench/scripts/mma_phase_clocks.py 2>&1 | grep -v Warning | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
