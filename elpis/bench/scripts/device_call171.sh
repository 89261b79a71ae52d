#!/bin/bash
# Call 171 (session 44), chained onto call 170's warm machine (its build and /tmp/full kept):
# - where the host's time goes in a composed round at 8K against 1K (call 164: 0.23 against 0.12 ms with the
#   same calls a round): `device_round_host_profile.py` under cProfile at both contexts;
# - the second A/B of `exl3-draft-candidates` under composed rounds (call 164: 17.12 -> 16.96 ms at 1K, gain
#   0.16 against noise 0.12), at 1K and 8K.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
gpu_line
full_model_ready
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH
for ctx in ${HOSTPROF_CONTEXTS:-8192 1024}; do
  echo "=== host profile at $ctx ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 3 120 python3 elpis/bench/scripts/device_round_host_profile.py /tmp/full/target /tmp/full/draft \
    --context $ctx --tokens 60 --top 45 --round-graph on > "$OUT/hostprof-$ctx-call171.txt" 2>&1
  echo "host profile $ctx: exit $?" | tee -a "$OUT/log"
  grep -E "HOSTPROF|function calls" "$OUT/hostprof-$ctx-call171.txt" | tee -a "$OUT/log"
done
ab switch-ab-candidates-call171 10 switch_ab.py --switches exl3-draft-candidates --contexts 1024,8192 --pairs 3
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
