#!/bin/bash
# Call 183 (session 46): does Python's cyclic collector make the slow rounds behind the host time's p90 at 1K
# (0.34 ms in call 173, against a 0.14-0.16 ms median)? On one load, at 1K and 8K, the host time a round with the
# collector as it is and frozen (gc.freeze), twice each, alternating; each HOSTTIME line marks the rounds a
# collection ran in and gives the p90 of the others (`rounds_ab.CollectorTime`). Then the cProfile window.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_full_synth
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH ELPIS_PATCH_DRAFT_CANDIDATES
echo "=== host time, collector default / frozen, 1K and 8K ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 $(( $(left) - 10 )) python3 elpis/bench/scripts/device_round_host_profile.py /tmp/full/target \
  /tmp/full/draft --context 1024 8192 --tokens 80 --top 30 --gc default freeze default freeze \
  > "$OUT/hostprof-gc-call183.txt" 2>&1
echo "host profile: exit $?" | tee -a "$OUT/log"
grep -E "HOSTTIME|HOSTPROF|Error" "$OUT/hostprof-gc-call183.txt" | cut -c1-900 | tee -a "$OUT/log"
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
