#!/bin/bash
# Call 43 (issue 9, session 12): the grouped build of elpis's 1-16-row EXL3 GEMM on the full-size synthetic
# checkpoints. The patch test that failed in call 42 for the test's own dtype order (rerun on the small model),
# then the round A/B of device_call37.sh (A: ELPIS_PATCH_ROWS_GEMM=1 with stock chain-8 beside; B: =0), then,
# if time is left, the 24 GiB test at 262,000 tokens with the patch on (otherwise device_call44.sh runs it on the
# same warm machine). Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
[ -f build/kernels/gemm_schedule.h ] || { echo "no gemm_schedule.h after the build" | tee -a "$OUT/log"; exit 1; }
ELPIS_SMALL_DIR=/tmp/small ELPIS_PATCH_ROWS_GEMM=1 gpu_pytest "rows GEMM patch tests" 90 \
  tests/exl3/test_rows_gemm_patch.py
wait_synth
title="issue 9: elpis's 1-16-row EXL3 GEMM, grouped"
engine_bench rowsgemm-kernel 1 stock,elpis-tree8,elpis-tree16 8 2 "$title (kernel), H200"
engine_bench rowsgemm-exllamav3-gemm 0 elpis-tree8,elpis-tree16 8 2 "$title (exllamav3-gemm), H200"
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
