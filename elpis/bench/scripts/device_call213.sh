#!/bin/bash
# Call 213 (session 55; no build or checkpoint needed): session 55's sampler beside the previous one in one
# process, calls alternating (call 212's figures came from a faster host than calls 208-209's: greedy and topk,
# unchanged, also ran faster). The previous module travels as .device/sampling_previous.py
# (`git show a297ac4:elpis/spec/sampling.py`).
# Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-200}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
gpu_line
SAMPLER_ARGS="--against .device/sampling_previous.py" sampler_time 150
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
