#!/bin/bash
# Call 118 (session 26, the session's last device minutes): the verify gate (switch exl3-verify-prelaunch, off)
# again, now that call 117 measured 0.56 / 0.90 ms (1K / 8K) from the draft's read-back to the verify's start
# without it. host_gaps.py at 1K and 8K, greedy tree-16 rounds, one torch thread (the served default), the gate
# off/on three times each in one process, 24 timed rounds each, no profiled window: round medians, the host's
# read-back-to-verify time and its time per step. A gain beyond the noise rule turns the gate on by default.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-480}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
wait_synth
echo "=== host gaps, gate off/on x3, 1K and 8K, no profiler ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 10 )) python3 elpis/bench/scripts/host_gaps.py /tmp/full/target /tmp/full/draft \
  --contexts 1024,8192 --threads 1 --prelaunch 0,1,0,1,0,1 --rounds 24 --profile 0 2>&1 \
  | grep -E "^HOSTGAPS|Error|error" | tee "$OUT/host_gaps_ab.txt" | sed -E 's/"round_ms": \[[^]]*\], //' \
  | cut -c1-700 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
