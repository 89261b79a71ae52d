#!/bin/bash
# Call 217 (staged in session 55 for the next session; a fresh machine, LIMIT ~560): whether exl3-sample-draw
# (session 55: the host's tokens on the GPU, a 16-row call 0.28-0.41 ms against 0.50-0.89) makes a sampled round
# faster, and the served GPU tests with it on, before it may go on by default:
# 1. the build and the full-size synthesis in the background; on the small model, with ELPIS_PATCH_SAMPLE_DRAW=1,
#    the sampled device-round and served tests (test_device_round.py's sampled and penalised host rounds,
#    test_serve_gpu.py) and the kernel's GPU test;
# 2. penalty_rounds.py --device-draw at 1K and 8K: the sampled request with the host draw and with the kernel's,
#    arms alternating in one process, tokens checked equal ("device_draw_saves_ms").
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
ELPIS_PATCH_SAMPLE_DRAW=1 gpu_pytest "sampled paths with the device draw" 200 tests/kernels/test_sample_draw.py \
  tests/exl3/test_device_round.py tests/exl3/test_serve_gpu.py -k "sample or sampled or penalised or serve"
finish_full_synth
penalty_rounds 1024,8192 --device-draw
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
