#!/bin/bash
# Call 223 (session 57; a fresh machine, LIMIT ~540): after call 222 (exl3-vocab-draw's device-round tests and the
# served test passed with it on; the kernels' GPU test failed only its count of rows drawn at the model's
# vocabulary, where the coarse rows tie past the weights read: the count now allows them):
# 1. the kernels' GPU test again, whole, with ELPIS_PATCH_VOCAB_DRAW=1;
# 2. penalty_rounds.py --gpu-vocab at 1K and 8K with the generator's backoff (undrawn rounds in a row leave the
#    device ever longer stretches of host rounds): the top_p arm's rounds, all undrawn on a random model's flat
#    rows, should now cost about a host round, not call 222's 50.8 ms.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-540}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
ELPIS_PATCH_VOCAB_DRAW=1 gpu_pytest "vocab draw kernels" 150 tests/kernels/test_vocab_draw.py
finish_full_synth
penalty_rounds 1024,8192 --gpu-vocab
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
