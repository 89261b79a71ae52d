#!/bin/bash
# Call 184 (session 46): the host time a round beside the host CPU's facts, to tell a slow host from a cost of
# the code (call 183's machine took 0.57-0.87 ms a round with the code that took 0.14-0.16 in call 173). Every
# HOSTTIME line now carries `hardware.host_facts()` (CPU model, usable CPUs, clock, load, and `python_loop_us`,
# a fixed pure-Python workload's time, which this machine is compared with other machines by).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
python3 -c "from elpis.bench import hardware; print('HOSTFACTS', hardware.host_facts())" | tee -a "$OUT/log"
build_and_full_synth
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH ELPIS_PATCH_DRAFT_CANDIDATES
echo "=== host time at 1K, twice ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 $(( $(left) - 8 )) python3 elpis/bench/scripts/device_round_host_profile.py /tmp/full/target \
  /tmp/full/draft --context 1024 --tokens 80 --top 25 --gc default default > "$OUT/hostprof-call184.txt" 2>&1
echo "host profile: exit $?" | tee -a "$OUT/log"
grep -E "HOSTTIME|HOSTPROF|Error" "$OUT/hostprof-call184.txt" | sed -E "s/'host_ms_rounds': \[[^]]*\], //" \
  | tee -a "$OUT/log"
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
