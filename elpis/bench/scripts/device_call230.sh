#!/bin/bash
# Call 230 (session 60; a fresh machine, LIMIT ~420): call 228 without GPU test (p), which call 228b passed, for a
# session whose device starts keep failing: the vocab draw kernels' GPU tests (the nucleus row count's threshold
# fixed after call 228b), then penalty_rounds.py --gpu-vocab at 1K: top_p 0.8 and min_p 0.05 on the random model's
# flat rows, GPU rounds (the nucleus deciding them) against host rounds (session 58: 19.38 ms with every device
# try undrawn against 18.58 on host rounds). device_call229.sh chains onto it.
# exl3-vocab-draw-nucleus is off by default: the tests and the bench arms turn it on themselves.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-420}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
gpu_pytest "vocab draw kernels with the nucleus" 120 tests/kernels/test_vocab_draw.py
finish_full_synth
penalty_rounds 1024 --gpu-vocab --pairs 2
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
