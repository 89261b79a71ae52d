#!/bin/bash
# Call 116 (session 26; sessions 25's staged calls 116 and 117 in one call, so one build and one set of
# checkpoints serve both):
# 1. GPU tests of the Gated DeltaNet tree kernel as served since call 115 (bit for bit call 114's and d63cb6e's
#    on gdn_vs_previous's trees, not yet through its own tests), the tree verify and its graphs;
# 2. GPU tests of the rows GEMM kernel and patch with the two staged input-launch switches exl3-mlp-act-input
#    and exl3-norm-input (the activation bit for bit ExLlamaV3's silu_mul, y and the residual bit for bit its
#    rms_norm_res_in and rms_norm, an eager tree verify's logits bit for bit with and without each switch);
# 3. the round: both switches off, on, off, on (alternating `elpis bench engine` runs of elpis-tree16 at 1K and
#    8K; stock chain-8 in the first, the same-run comparison for the served kernel), for a pooled A/B
#    (ab_pooled.py; arm A the switches on).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
# chained right after device_ext_build.sh on a warm machine: its build and checkpoints are still there
if [ -d build/accept ] && [ -f /tmp/full/draft/config.json ] && [ -d /tmp/small ]; then
  echo "warm machine: build and checkpoints reused" | tee -a "$OUT/log"; BUILD=""; SYNTH=""
else
  start_build_and_synths
  wait_build
fi
gpu_pytest "gdn tree kernel, tree verify and graphs" 150 tests/kernels/test_gdn_tree.py tests/exl3/test_tree_verify.py \
  tests/exl3/test_tree_graph.py
gpu_pytest "rows GEMM kernel and patch" 150 tests/kernels/test_rows_gemm.py tests/exl3/test_rows_gemm_patch.py
[ -n "$SYNTH" ] && wait_synth
engine_switch_ab round-fused "MLP act and norm input launches" ELPIS_PATCH_MLP_ACT_INPUT ELPIS_PATCH_NORM_INPUT
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
