#!/bin/bash
# Call 204 (session 51; a fresh machine, LIMIT ~420): what presence_penalty 1.5 costs a round
# (elpis/bench/scripts/penalty_rounds.py) on the full-size synthetic checkpoints, tree-16 served configuration,
# 1K and 8K: greedy (rounds on the GPU) against greedy with the penalty (host rounds), and Qwen's recommended
# sampled settings with and without it (host rounds both). Run with run(carry=[".whl", ".device"]) and
# ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-420}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_full_synth
penalty_rounds 1024,8192
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
