#!/bin/bash
# Call 205 (session 51; a fresh machine, LIMIT ~170, the session's last device seconds): the sampler's rows on
# streams of their own (elpis.spec.sampling._drive). First, before anything else loads the GPU, sampler_time.py
# (the session's earlier timing, every row one after another: 16 rows 14.4 ms under Qwen's recommended settings,
# H100). Then the CUDA sampling test (a row's token alone or among others, filters alike) and, as far as the
# limit reaches, the sampled and penalised host rounds of test_device_round.py on the small model. Run with
# run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-170}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
gpu_line
timeout -k 3 60 python3 elpis/bench/scripts/sampler_time.py 2>&1 | tail -3 | tee -a "$OUT/log"
start_build
gpu_pytest "sampling on CUDA" 60 tests/spec/test_sampling.py
timeout -k 2 40 python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1 | tee -a "$OUT/log"
join_build
export ELPIS_SMALL_DIR=/tmp/small
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH ELPIS_PATCH_DRAFT_CANDIDATES
gpu_pytest "sampled and penalised host rounds" $(( $(left) - 5 )) tests/exl3/test_device_round.py -k "sampled or penalised"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
