#!/bin/bash
# Call 228 (session 59; a fresh machine, LIMIT ~570): the vocab draw's nucleus (rows the head's 256 weights do not
# decide, decided over the whole row on the GPU by an exact radix select):
# 1. the kernels' GPU tests (flat rows and a weight shared by +0 / -0 at the model's vocabulary, fp16, fp32 and
#    float64) and test (p) of tests/exl3/test_device_round.py (top_p and min_p on the random model's flat rows: every
#    round on the GPU now, plain decoding's tokens), with (a) beside it;
# 2. penalty_rounds.py --gpu-vocab at 1K: top_p 0.8 and min_p 0.05 on flat rows, GPU rounds against host rounds
#    (session 58: 19.38 ms with every device try undrawn against 18.58 on host rounds).
# exl3-vocab-draw-nucleus is off by default: the tests and the bench arms turn it on themselves.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-570}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
gpu_pytest "vocab draw kernels with the nucleus" 120 tests/kernels/test_vocab_draw.py
gpu_pytest "rounds without top_k on the GPU" 200 tests/exl3/test_device_round.py \
  -k "without_top_k or rounds_on_the_gpu_give_plain"
finish_full_synth
penalty_rounds 1024 --gpu-vocab --pairs 2
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
