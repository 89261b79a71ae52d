#!/bin/bash
# Call 44 (issue 9, session 12): the 24 GiB test at 262,000 tokens (tree-16 with graphs) with the patch
# exl3-rows-gemm on, on the machine call 43 left warm (its build and /tmp/full are reused; a fresh machine makes
# them first). Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
if [ ! -f /tmp/full/draft/config.json ] || [ ! -f build/kernels/gemm_schedule.h ]; then
  start_build_and_full_synth
  wait_build
  wait_synth
fi
ELPIS_PATCH_ROWS_GEMM=1 gib24_test "tree-16 with graphs, rows GEMM on, 262K"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
