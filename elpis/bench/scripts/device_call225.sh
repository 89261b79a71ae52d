#!/bin/bash
# Call 225 (session 58; a fresh machine, LIMIT ~570): session 57's review mends (the draws' shared steps header,
# one maxima helper, the backoff's count) checked on the GPU, and call 224's staged question answered:
# 1. the kernels' GPU tests (vocab draw, sample draw, round tail) and tests/exl3/test_device_round.py whole (with
#    (q), new: a thinking budget over rounds on the GPU), with
#    the registry's defaults (exl3-vocab-draw on; (p) turns the heads on itself);
# 2. penalty_rounds.py --gpu-vocab at 1K, two timed passes an arm: the top_p-cold arm (temperature 0.1, top_p 0.8:
#    peaked rows on a random model) says what exl3-vocab-draw-heads gains where the 256 weights hold the prefix.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-570}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
gpu_pytest "kernels and device rounds, registry defaults" 260 tests/kernels/test_vocab_draw.py \
  tests/kernels/test_sample_draw.py tests/kernels/test_round_tail.py tests/exl3/test_device_round.py
finish_full_synth
penalty_rounds 1024 --gpu-vocab --pairs 2
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
