#!/bin/bash
# Call 206 (session 52, a fresh machine, LIMIT ~60): top_p without top_k now ranks the whole vocabulary with one
# stable sort on the device and finds its prefix by an exact integer search (elpis/spec/sampling.py); call 205 timed
# the host-widened head at 9.1 ms for 16 rows on an H100. sampler_time.py again and the CUDA sampling test (rows
# alone or together, a top_k head and the ranked vocabulary). No build or checkpoint needed. Run with
# run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-60}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
sampler_time 40
gpu_line
gpu_pytest "sampling on CUDA" 15 tests/spec/test_sampling.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
