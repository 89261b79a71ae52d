#!/bin/bash
# Call 117 (staged in session 25 for the next session): the switch exl3-mlp-act-input (off), whose rows GEMM entry
# computes an MLP's SiLU-and-multiply inside its down projection's input launch (one launch a layer fewer).
# 1. GPU tests: the rows GEMM kernel (the new entry's activation bit for bit ExLlamaV3's silu_mul, in place too,
#    and its output the plain GEMM's of it) and the patch (an eager tree verify's logits bit for bit equal with
#    and without the switch, every MLP taking it);
# 2. the round, switch off, on, off, on (alternating `elpis bench engine` runs of elpis-tree16 at 1K and 8K; stock
#    in the first), for a pooled A/B (ab_pooled.py; arm A the switch on).
# If the tests pass and the A/B shows a gain, the switch's default can turn on (registry, patches/README).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
gpu_pytest "rows GEMM kernel and patch" 200 tests/kernels/test_rows_gemm.py tests/exl3/test_rows_gemm_patch.py
wait_synth
export ELPIS_PATCH_MLP_ACT_INPUT=0
engine_bench round-act-off-1 1 stock,elpis-tree16 12 3 "MLP act input off"
export ELPIS_PATCH_MLP_ACT_INPUT=1
engine_bench round-act-on-1 1 elpis-tree16 12 3 "MLP act input on"
export ELPIS_PATCH_MLP_ACT_INPUT=0
engine_bench round-act-off-2 1 elpis-tree16 12 3 "MLP act input off"
export ELPIS_PATCH_MLP_ACT_INPUT=1
engine_bench round-act-on-2 1 elpis-tree16 12 3 "MLP act input on"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
