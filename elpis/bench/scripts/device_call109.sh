#!/bin/bash
# Call 109 (staged in session 24 for the next session; its device time was spent on calls 103-108): the switch
# exl3-gdn-qkv-channel-major (off), whose rows GEMM epilogue writes the Gated DeltaNet qkv as bf16 channel-major
# so that ExLlamaV3's cast and transposed copy of it do not run. Bit for bit by construction; the kernel's mode
# passed its GPU test in call 111, the model-level test has not run.
# 1. GPU tests: the rows GEMM kernel (its output modes changed) and the patch, whose new test compares an eager
#    tree verify's logits with and without the switch, bit for bit, on the small model;
# 2. the round, switch off then on then off again (alternating `elpis bench engine` runs of elpis-tree16 at 1K
#    and 8K; stock in the first), for a pooled A/B (`ab_pooled.py`).
# If the test passes and the A/B shows the ~0.25 ms, the switch's default can turn on.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
gpu_pytest "rows GEMM kernel and patch" 150 tests/kernels/test_rows_gemm.py tests/exl3/test_rows_gemm_patch.py
wait_synth
export ELPIS_PATCH_GDN_QKV_CHANNEL_MAJOR=0
engine_bench round-qkv-off-1 1 stock,elpis-tree16 12 3 "qkv channel-major off"
export ELPIS_PATCH_GDN_QKV_CHANNEL_MAJOR=1
engine_bench round-qkv-on-1 1 elpis-tree16 12 3 "qkv channel-major on"
export ELPIS_PATCH_GDN_QKV_CHANNEL_MAJOR=0
engine_bench round-qkv-off-2 1 elpis-tree16 12 3 "qkv channel-major off"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
