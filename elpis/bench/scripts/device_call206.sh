#!/bin/bash
# Call 206 (session 52, a fresh machine, LIMIT ~270): top_p without top_k now ranks the whole vocabulary with one
# stable sort on the device and finds its prefix by an exact integer search (elpis/spec/sampling.py); call 205 timed
# the host-widened head at 9.1 ms for 16 rows on an H100. sampler_time.py again and the CUDA sampling test (rows
# alone or together, a top_k head and the ranked vocabulary), before the build; then what a grammar costs a round
# (penalty_rounds.py --grammar at 1K: greedy and sampled requests held to a JSON schema, beside call 205's arms).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-270}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
timeout -k 3 60 python3 elpis/bench/scripts/sampler_time.py 2>&1 | tail -3 | tee -a "$OUT/log"
gpu_pytest "sampling on CUDA" 30 tests/spec/test_sampling.py
start_build_and_full_synth
join_build
finish_full_synth
penalty_rounds 1024 --grammar
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
