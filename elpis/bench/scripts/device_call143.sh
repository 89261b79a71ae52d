#!/bin/bash
# Call 143 (staged in session 34 for a later session; needs .device/ext.so.xz.part-*, see device_common.sh, and
# call 142's GPU tests of the rounds on the GPU to have passed): greedy rounds decided on the GPU
# (elpis/exl3/device_round.py, registry switch exl3-device-rounds) against host rounds.
# 1. device_round_ab.py: one process, one backend (the served configuration with the embedding gather and device
#    rounds on), 1K and 8K, 3 timed pairs of 40-token requests, the arms alternating (host rounds with the
#    backend's device rounds detached): medians, MADs, the noise rule, and the two arms' tokens compared;
# 2. if the time allows, the round at 1K / 8K with device rounds beside stock in the same run (elpis bench
#    engine, both switches on).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_full_synth
echo "=== device rounds A/B ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 150 )) python3 elpis/bench/scripts/device_round_ab.py /tmp/full/target \
  /tmp/full/draft --out "$OUT/device-round-ab.json" --contexts 1024,8192 --tokens 40 --pairs 3 \
  > "$OUT/device-round-ab.txt" 2>&1
echo "device rounds A/B: exit $?" | tee -a "$OUT/log"
grep -E "DEVROUNDAB|Error|error" "$OUT/device-round-ab.txt" | tail -6 | tee -a "$OUT/log"
export BENCH_MARGIN=10 ELPIS_PATCH_DEVICE_ROUNDS=1 ELPIS_PATCH_EMBED_GATHER=1
[ "$(left)" -gt 140 ] && engine_bench round-1k8k-device 1 stock,elpis-tree16 8 2 "elpis tree-16, rounds on the GPU, H200"
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
