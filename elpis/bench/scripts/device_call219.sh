#!/bin/bash
# Call 219 (session 56; a fresh machine, LIMIT ~560): requests with penalties and logit_bias with their rows
# adjusted on the GPU and their rounds there (registry patch exl3-round-adjust), and whether to turn it on:
# 1. the build and the full-size synthesis in the background; on the small model (switches at their defaults:
#    the tests turn adjusting on themselves), the device-round tests of penalised requests (l) and (o) and of
#    sampled ones (n);
# 2. the served test (full size) with ELPIS_PATCH_ROUND_ADJUST=1: its penalised greedy and sampled requests then
#    run on the GPU, against `--tree-budget 1` on the same requests;
# 3. penalty_rounds.py --gpu-sampled --gpu-adjusted at 1K and 8K: the penalised requests on host rounds and on
#    the GPU's, arms alternating in one process, tokens checked equal ("gpu_adjusted_saves_ms").
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
gpu_pytest "penalised and sampled rounds on the GPU" 170 tests/exl3/test_device_round.py -k "penalised or sampled"
finish_full_synth
ELPIS_PATCH_ROUND_ADJUST=1 ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft \
  gpu_pytest "served, round adjust on" 150 tests/exl3/test_serve_gpu.py
penalty_rounds 1024,8192 --gpu-sampled --gpu-adjusted
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
