#!/bin/bash
# Call 207 (staged in session 52 for the next session; a fresh machine, LIMIT ~340): the served exl3 test with a
# required tool call added (tests/exl3/test_serve_gpu.py), then what a grammar costs a round: penalty_rounds.py
# --grammar at 1K, greedy and sampled requests held to a JSON schema (every row masked on the host, host rounds)
# beside call 205's arms (greedy on the GPU, presence_penalty, Qwen's recommended sampling).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-340}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
join_build
finish_full_synth
ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft \
  gpu_pytest "served with grammars and a tool call" 160 tests/exl3/test_serve_gpu.py
penalty_rounds 1024 --grammar
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
