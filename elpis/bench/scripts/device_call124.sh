#!/bin/bash
# Call 124 (session 29): where the verify's input fill spends its host time, and a third A/B of the embedding
# gather (switch exl3-embed-gather, off; call 122's two-run A/B: 1K beyond the noise rule, 8K 0.36 ms against
# 0.40 of noise).
# 1. host_gaps.py at 1K with the gather on, one torch thread, no torch profiler, Python's collector as it is and
#    then frozen, with a cProfile window: the host's time per step and the functions with the most own time
#    (call 122 ran out of time before it);
# 2. the round, the gather off / on alternating, three pairs (stock chain-8 in the first run).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready
echo "=== host gaps, gather on, 1K, collector default/frozen, cProfile ($(left) s left)" | tee -a "$OUT/log"
ELPIS_PATCH_EMBED_GATHER=1 timeout -k 5 150 python3 elpis/bench/scripts/host_gaps.py \
  /tmp/full/target /tmp/full/draft --contexts 1024 --threads 1 --rounds 24 --gc default,freeze --cprofile 1 \
  --profile 0 2>&1 | grep -E "^HOSTGAPS|Error|error" | tee "$OUT/host_gaps_gather.txt" \
  | sed -E 's/"round_ms": \[[^]]*\], //; s/"cprofile": .*//' | cut -c1-1200 | tee -a "$OUT/log"
for pass in 1 2 3; do
  systems=elpis-tree16; [ $pass = 1 ] && systems=stock,elpis-tree16
  [ "$(left)" -gt 90 ] && ELPIS_PATCH_EMBED_GATHER=0 engine_bench "round-gather-off-$pass" 1 "$systems" 12 3 \
    "gather off $pass"
  [ "$(left)" -gt 60 ] && ELPIS_PATCH_EMBED_GATHER=1 engine_bench "round-gather-on-$pass" 1 elpis-tree16 12 3 \
    "gather on $pass"
done
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
