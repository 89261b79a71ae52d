#!/bin/bash
# Call 231 (session 60, staged; a fresh machine, LIMIT ~450): the GPU tests under the registry's defaults now that
# exl3-vocab-draw-nucleus is on (session 60 ran them with the switch set by the environment):
# the vocab draw, sample draw and round tail kernels' GPU tests, tests/exl3/test_device_round.py whole and the
# served test (tests/exl3/test_serve_gpu.py), no ELPIS_PATCH_* set.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-450}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
small_model_only
gpu_pytest "kernels and device rounds, registry defaults" 330 tests/kernels/test_vocab_draw.py \
  tests/kernels/test_sample_draw.py tests/kernels/test_round_tail.py tests/exl3/test_device_round.py
gpu_pytest "served, registry defaults" $(( $(left) - 15 )) tests/exl3/test_serve_gpu.py
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
