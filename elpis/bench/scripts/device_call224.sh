#!/bin/bash
# Call 224 (session 57; a fresh machine, LIMIT ~330, the session's last device minutes): whether the head's rounds
# (exl3-vocab-draw-heads) gain where rows are peaked. A random model's rows are flat, so top_p 0.8 left every round
# to the host in calls 222-223; at temperature 0.1 the same model's rows are peaked as a real model's. The build
# and the full-size synthesis only, then penalty_rounds.py --gpu-vocab at 1K, one timed pass an arm.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-330}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_full_synth
penalty_rounds 1024 --gpu-vocab --pairs 1
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
