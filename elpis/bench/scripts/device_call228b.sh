#!/bin/bash
# Call 228b (session 59; a fresh machine, LIMIT ~400): call 228's correctness half alone, for a session with little
# device time left: the vocab draw kernels' GPU tests with the nucleus (flat rows and a boundary among +0 / -0 at
# the model's vocabulary, each row kind) and test (p) of tests/exl3/test_device_round.py (top_p and min_p on the
# random model's flat rows: every round on the GPU, plain decoding's tokens). No full-size model, no bench.
# exl3-vocab-draw-nucleus is off by default: the tests turn it on themselves.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-400}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
small_model_only
gpu_pytest "vocab draw kernels with the nucleus" 120 tests/kernels/test_vocab_draw.py
gpu_pytest "rounds without top_k on the GPU" $(( $(left) - 15 )) tests/exl3/test_device_round.py -k "without_top_k"
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
