#!/bin/bash
# Call 117 (session 26): the switch exl3-norm-input after call 116 found its model test vacuous. The small model's
# hidden size (1024) is normed in ExLlamaV3's one-pass form, which the entry leaves alone, and at the full width a
# Qwen3.5 block's sublayer outputs are fp32, a residual form the entry refused until now.
# 1. GPU tests: the rows GEMM kernel (the norm entry against ExLlamaV3's rms_norm_res_in with fp32 x as well)
#    and the patch (the norm test on a four-layer synthetic target of the full width, every marked norm taking
#    the entry; the other switches' tests again);
# 2. the round, exl3-mlp-act-input and exl3-norm-input both off, on, off, on (stock in the first run), for a
#    pooled A/B (arm A the switches on);
# 3. host_gaps.py at 1K and 8K with the defaults: the host's time per step, unprofiled, and the profiled GPU
#    idle by host step (issue 9's host path);
# 4. if time is left, the per-phase profile with both switches on.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
gpu_pytest "rows GEMM kernel and patch" 170 tests/kernels/test_rows_gemm.py tests/exl3/test_rows_gemm_patch.py
wait_synth
engine_switch_ab round-norm "MLP act and norm input launches" ELPIS_PATCH_MLP_ACT_INPUT ELPIS_PATCH_NORM_INPUT
echo "=== host gaps ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) > 150 ? 140 : $(left) - 10 )) python3 elpis/bench/scripts/host_gaps.py /tmp/full/target \
  /tmp/full/draft --contexts 1024,8192 --rounds 12 2>&1 | grep -E "^HOSTGAPS|Error|error" \
  | tee "$OUT/host_gaps.txt" | cut -c1-1500 | tee -a "$OUT/log"
if [ "$(left)" -gt 230 ]; then
  ELPIS_PATCH_MLP_ACT_INPUT=1 ELPIS_PATCH_NORM_INPUT=1 tree_profile 10
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
