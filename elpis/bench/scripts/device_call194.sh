#!/bin/bash
# Call 194 (staged in session 47 for the next session; a fresh machine, LIMIT ~420): the GPU tests that run the
# eager tree mode, after session 47 put its verifies on the graphs' module path (`capture.plain_module_path`
# around `_verify_tree`'s eager forward: an 8-row eager verify had run ExLlamaV3's graph-captured MLP blocks).
# Calls 192-193 ran tests/exl3/test_tree_graph.py with the change (8 passed; the 8-row test fails on the old
# code). These are the other files that load `tree_graphs=False`: test_tree_verify.py (lossless trees in the
# eager tree mode at 8 and 16 rows, the tree against stock's chain), test_rows_gemm_patch.py (the kernel reaches
# the linears of an eager verify), test_prefill_groups.py; then the device rounds, whose plain decoding they
# compare with. Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-420}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
gpu_pytest "eager tree mode on the graphs' module path" 240 tests/exl3/test_tree_verify.py \
  tests/exl3/test_rows_gemm_patch.py tests/exl3/test_prefill_groups.py
gpu_pytest "device rounds" $(( $(left) - 15 )) tests/exl3/test_device_round.py
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
