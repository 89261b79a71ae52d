#!/bin/bash
# Call 214 (session 55, a fresh machine, LIMIT ~560): session 55's penalty adjustment (only the columns that can
# change, gathered; bit for bit the whole-row arithmetic) on the GPU:
# 1. the build and the full-size synthesis in the background; once built, the penalised device-round test (l)
#    on the small model (greedy and sampled: plain penalised decoding's tokens) and the CUDA sampling test;
# 2. sampler_time.py --against the previous revision's sampling.py and penalties.py (.device/spec_previous, from
#    `git show a297ac4:elpis/spec/{sampling,penalties}.py`): adjustment bits and draws checked equal, the two
#    revisions alternating call by call;
# 3. penalty_rounds.py at 1K: what presence_penalty 1.5 adds to a sampled and a greedy round (call 212: 0.82 and
#    1.15 ms).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
gpu_pytest "penalised rounds and CUDA sampling" 150 tests/exl3/test_device_round.py tests/spec/test_sampling.py \
  -k "penalised or sampling_on_cuda"
finish_full_synth
SAMPLER_ARGS="--against .device/spec_previous" sampler_time 150
penalty_rounds 1024
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
