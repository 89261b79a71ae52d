#!/bin/bash
# Call 216 (session 55; no build or checkpoint needed, LIMIT ~150; ran, then sampler_time twice more on the warm
# machine, call 216b): registry patch exl3-sample-draw on the GPU:
# 1. tests/kernels/test_sample_draw.py: the kernel's tokens are the host sampler's on CUDA rows of every kind
#    (9,001 and 248,320 columns), and sample_rows with the device draw installed draws the host's tokens;
# 2. sampler_time.py: "recommended-device" (the kernel's draw) beside "recommended" (the host's) in one run.
# Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-150}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
gpu_line
gpu_pytest "sample draw on the GPU" 60 tests/kernels/test_sample_draw.py
sampler_time $(( $(left) - 5 ))
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
