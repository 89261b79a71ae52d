#!/bin/bash
# Call 117 (staged in session 25 for the next session): the switches exl3-mlp-act-input and exl3-norm-input (both
# off), whose rows GEMM entries compute an MLP's SiLU-and-multiply, and a transformer block's RMSNorm, inside the
# input launch of the projection(s) reading them (a launch fewer each, 64 + 128 a tree-16 verify).
# 1. GPU tests: the rows GEMM kernel (the activation bit for bit ExLlamaV3's silu_mul, in place too; y and the
#    residual bit for bit its rms_norm_res_in and rms_norm; the GEMMs over the written fragments the plain GEMMs'
#    of those inputs) and the patch (an eager tree verify's logits bit for bit equal with and without each switch,
#    every marked module taking its path);
# 2. the round, both switches off, on, off, on (alternating `elpis bench engine` runs of elpis-tree16 at 1K and 8K;
#    stock in the first), for a pooled A/B (ab_pooled.py; arm A the switches on).
# A switch whose tests pass, with an A/B gain, can turn on by default (registry, patches/README).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
gpu_pytest "rows GEMM kernel and patch" 200 tests/kernels/test_rows_gemm.py tests/exl3/test_rows_gemm_patch.py
wait_synth
for run in off-1 on-1 off-2 on-2; do
  state=0; [ "${run%-*}" = on ] && state=1
  export ELPIS_PATCH_MLP_ACT_INPUT=$state ELPIS_PATCH_NORM_INPUT=$state
  systems=elpis-tree16; [ $run = off-1 ] && systems=stock,elpis-tree16
  engine_bench "round-fused-$run" 1 "$systems" 12 3 "MLP act and norm input launches $run"
done
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
