#!/bin/bash
# Call 77 (session 19): the verify gate's A/B without the profiler, then issue 10's served bench.
# 1. host_gaps.py at 1K and 8K, greedy tree-16 rounds, one torch thread, the gate off/on three times each in one
#    process, 24 timed rounds each and no profiled window: round medians, and the host's time from the draft's
#    read-back to the verify's start (the gate opened, or the verify graph launched). Call 76's profiled A/B
#    counted the gate's wait as GPU time and its 12-round medians were within noise at 1K. It also compiles
#    Triton's kernels, so stock's first request below is not a first run on a fresh machine (as in call 74).
# 2. the served bench, stock and elpis-tree16 at 8K and 32K, cumulative and fresh TTFTs, after the embedding
#    change (call 75): written in session 18 as call 76.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set; call 78 (profile, 128K) follows.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready
echo "=== host gaps, gate off/on x3, 1K and 8K, no profiler ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 150 python3 elpis/bench/scripts/host_gaps.py /tmp/full/target /tmp/full/draft \
  --contexts 1024,8192 --threads 1 --prelaunch 0,1,0,1,0,1 --rounds 24 --profile 0 2>&1 \
  | grep -E "^HOSTGAPS|Error|error" | tee "$OUT/host_gaps_ab.txt" | sed -E 's/"round_ms": \[[^]]*\], //' \
  | tee -a "$OUT/log"
served_bench freshbench "issue 10: served prefill, groups of sixteen, embedding ahead of the first block, stock vs elpis"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
