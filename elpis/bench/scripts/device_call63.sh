#!/bin/bash
# Call 63 (issue 10, written in session 15 for the next session): prefill with the served defaults (tree
# mode, layer-major prefill groups on).
# 1. the small-model engine tests with the new default (test_gpu.py: lossless speculation, elpis's chain
#    verify token for token stock's generator, prefix reuse GPU tier and disk across a restart; all prefill in
#    groups now) and the groups' own test;
# 2. `elpis bench profile` of the last prefill chunks before 32K, stock vs elpis-tree16, with kernel names per
#    phase (the 2026-11-30 profile had families only; "other: copy" was 8.8 µs per token for elpis and 15.5
#    for stock, unexplained).
# Call 64 then benches the served prefill against stock.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set; at most 8 files come back (packed).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "engine tests with prefill groups" 200 -k "not 24gib" \
  tests/exl3/test_gpu.py tests/exl3/test_prefill_groups.py
wait_synth
echo "=== prefill profile at 32K ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 220 python3 -m elpis.cli bench profile --systems stock,elpis-tree16 \
  --model /tmp/full/target --draft /tmp/full/draft --out-dir "$OUT" --time-limit 200 \
  --checkpoints 32768 --profile-prefill 32768 --stem prefill-profile 2>&1 | grep -v "it/s\]$" | tail -12 | tee -a "$OUT/log"
grep -h "prefill 32K" "$OUT/prefill-profile.md" | cut -c1-1500 | tee -a "$OUT/log"
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
