#!/bin/bash
# Call 162 (session 42): the rest of tests/exl3 with the registry's defaults (round graphs on) that call 161's
# 200 s did not reach, the gate provider's op test first (it failed there: exl3-round-graph was missing from
# the gate's neutral patches, fixed). Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-300}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
export ELPIS_SMALL_DIR=/tmp/small
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH
gpu_pytest "exl3 rest, registry defaults (round graphs on)" $(( $(left) - 5 )) tests/exl3/test_gate_provider.py \
  tests/exl3/test_gdn_ba_patch.py tests/exl3/test_gpu.py tests/exl3/test_tree_verify.py tests/exl3/test_verify_gate.py \
  tests/exl3/test_rows_gemm_patch.py tests/exl3/test_prefill_groups.py tests/exl3/test_slice_pointers.py \
  tests/exl3/test_upload.py --durations=5
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
