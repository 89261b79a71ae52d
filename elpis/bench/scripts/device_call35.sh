#!/bin/bash
# Call 35 (issue 9): the registry patch exl3-rows-gemm on the small model. The patch's own GPU tests (the kernel
# really serves the linears; lossless with the draft on, off and accepted), then the lossless tests of the
# chain path and of tree mode with ELPIS_PATCH_ROWS_GEMM=1 (load_backend's default follows the switch, so every
# backend these tests load runs the kernel; the tests that compare with stock's own kernels are left out), then
# the op gate on the small model with rows-gemm among the candidates (part gate). Run with
# run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-570}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
( ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build ) > /tmp/build.log 2>&1 &
BUILD=$!
timeout -k 2 60 python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1 | tee -a "$OUT/log"
wait $BUILD || { tail -20 /tmp/build.log | tee -a "$OUT/log"; exit 1; }
tail -2 /tmp/build.log | tee -a "$OUT/log"
export ELPIS_SMALL_DIR=/tmp/small
ELPIS_PATCH_ROWS_GEMM=1 gpu_pytest "rows GEMM kernel and patch tests" 150 tests/kernels/test_rows_gemm.py \
  tests/exl3/test_rows_gemm_patch.py
ELPIS_PATCH_ROWS_GEMM=1 gpu_pytest "chain path lossless with the kernel" 150 tests/exl3/test_gpu.py \
  -k "engine_rounds or draft_on_off or accepted_drafts or spec_core"
ELPIS_PATCH_ROWS_GEMM=1 gpu_pytest "tree mode lossless with the kernel" 150 tests/exl3/test_tree_verify.py \
  -k "invariant or lossless or product_path"
part gate
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
