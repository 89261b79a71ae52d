#!/bin/bash
# Call 163 (session 43): the GPU tests of what sessions 42-43 changed and no GPU has run yet, with the registry's
# defaults (round graphs on):
# - the round tail reads the sequence's page count from device memory (uploaded with the verify's block table),
#   so a composed round's key no longer holds it: test_round_graph.py's new (f) (a page edge and another request
#   length inside one bucket compose nothing, records bit for bit the pieces'), the tail kernel's GPU test and
#   load-time check (a padded table, counts outside it);
# - session 42's fix for a backend whose row count changed (a new pool; call 162 met PyTorch's allocator assert
#   in test_gdn_ba_patch.py::test_product_path_with_the_patch) and its test (e);
# - the block tables' uploads skipped where the key's table holds the pages (records compared bit for bit);
# - the row-scan kernels on the proved within-span schedule (build/kernels/row_scan_schedule.h): verify
#   epilogue and draft candidates, bit for bit against torch;
# - the tests/exl3 files calls 161-162 did not run with the defaults.
# The full-size synthesis runs beside them for call 164 (chained on this machine).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
join_build
export ELPIS_SMALL_DIR=/tmp/small
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH
gpu_pytest "round tail and row-scan kernels" 150 tests/kernels/test_round_tail.py \
  tests/kernels/test_verify_epilogue.py tests/kernels/test_draft_candidates.py
gpu_pytest "round graphs (page count on the device, a row-count change), defaults" 300 \
  tests/exl3/test_round_graph.py tests/exl3/test_gdn_ba_patch.py::test_product_path_with_the_patch \
  tests/exl3/test_device_round.py
gpu_pytest "the rest of tests/exl3, defaults" $(( $(left) - 15 )) tests/exl3/test_rows_gemm_patch.py \
  tests/exl3/test_prefill_groups.py tests/exl3/test_slice_pointers.py tests/exl3/test_upload.py
finish_full_synth
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
