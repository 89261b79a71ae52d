#!/bin/bash
# Call 194 (staged in session 47 for the next session; a fresh machine, LIMIT ~590): the GPU tests that run the
# eager tree mode, after session 47 put its verifies on the graphs' module path (`capture.plain_module_path`
# around `_verify_tree`'s eager forward: an 8-row eager verify had run ExLlamaV3's graph-captured MLP blocks).
# Calls 192-193 ran tests/exl3/test_tree_graph.py with the change (8 passed; the 8-row test fails on the old
# code). These are the other files that load `tree_graphs=False`: test_tree_verify.py (lossless trees in the
# eager tree mode at 8 and 16 rows, the tree against stock's chain), test_rows_gemm_patch.py (the kernel reaches
# the linears of an eager verify), test_prefill_groups.py; then the device rounds, whose plain decoding they
# compare with. First, new in session 47 and not yet run: test_tree_graph.py's check that a tree's logits do not
# depend on the backend's run size (8 or 16 rows), what a per-round run size would rest on.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
# a fresh machine's first GPU process warms Triton's cache (call 191's first file took over 150 s, 25 s warm)
gpu_pytest "run size: a tree's 8-row and 16-row runs" 200 tests/exl3/test_tree_graph.py -k run_size
gpu_pytest "eager tree mode on the graphs' module path" 240 tests/exl3/test_tree_verify.py \
  tests/exl3/test_rows_gemm_patch.py tests/exl3/test_prefill_groups.py
gpu_pytest "device rounds" $(( $(left) - 15 )) tests/exl3/test_device_round.py
pack_outputs
# this checkout carries no Triton or autotune cache (.device/caches.tar.xz.part-*): bring this machine's back, for
# the next calls' carry (copy the parts into .device/); a fresh machine then skips ~100 s of Triton warm-up
save_caches >/dev/null
ls "$OUT"/caches.tar.xz.part-* | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
