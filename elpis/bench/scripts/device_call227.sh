#!/bin/bash
# Call 227 (session 58; a fresh machine, LIMIT ~560): logprobs requests with their rounds on the GPU
# (exl3-round-logprobs, off until this runs):
# 1. GPU test (r) of tests/exl3/test_device_round.py (greedy and sampled logprobs requests: plain decoding's tokens
#    and log-probabilities, the draft's trees and the known continuation's deep ones), with (a) and (q) beside it;
# 2. penalty_rounds.py --gpu-logprobs at 1K: what logprobs requests' rounds save on the GPU against host rounds.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
gpu_pytest "logprobs rounds on the GPU" 200 tests/exl3/test_device_round.py \
  -k "logprobs or thinking_budget or rounds_on_the_gpu_give_plain"
finish_full_synth
penalty_rounds 1024 --gpu-logprobs --pairs 2
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
