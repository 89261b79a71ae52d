#!/bin/bash
# Call 218 (session 56; a fresh machine, LIMIT ~560): sampled top_k requests with their rounds on the GPU
# (DeviceRounds.draws: each row drawn there by exl3-sample-draw's kernel from the request's parameters in device
# memory), and whether it is worth turning exl3-sample-draw on:
# 1. the build and the full-size synthesis in the background; on the small model, with ELPIS_PATCH_SAMPLE_DRAW=1,
#    the kernel's GPU test, the device-round tests of sampled requests (n), the flagged-row test (its hook's new
#    signature), the penalised host rounds (l) and the first greedy test, then the served test (full size, a
#    sampled top_k request among its requests);
# 2. penalty_rounds.py --device-draw --gpu-sampled at 1K and 8K: the sampled request on host rounds with the
#    host draw, with the kernel's draw, and on the GPU's rounds, arms alternating in one process, tokens checked
#    equal ("device_draw_saves_ms", "gpu_rounds_save_ms", "gpu_sampled_over_greedy_ms").
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
ELPIS_PATCH_SAMPLE_DRAW=1 gpu_pytest "sampled rounds on the GPU" 170 tests/kernels/test_sample_draw.py \
  tests/exl3/test_device_round.py -k "sample or sampled or penalised or flagged or rounds_on_the_gpu_give"
finish_full_synth
ELPIS_PATCH_SAMPLE_DRAW=1 ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft \
  gpu_pytest "served, sample draw on" 150 tests/exl3/test_serve_gpu.py
penalty_rounds 1024,8192 --device-draw --gpu-sampled
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
