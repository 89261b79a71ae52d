#!/bin/bash
# Call 23 (session 8): the defaults after call 22's gate PASS and call 21's draft graphs, on the GPU.
# 8192-token prefill chunks and graph-replayed DFlash2 draft blocks are now what load_backend does unasked.
# Run with run(carry=[".whl", ".device"]).
#  1. build and the full-size synthetic checkpoints (background);
#  2. the small-model engine tests with the new defaults: tests/exl3/test_gpu.py (elpis == stock's Generator
#     token for token at the same chunk size, draft on/off, prefix reuse exact, ...) but its 24 GiB tests,
#     and tests/exl3/test_draft_graph.py;
#  3. the 24 GiB test at full size with the new defaults (262,000-token prefill in 8192-token chunks + 128
#     tokens under the cap, tree-16 with graph-replayed verifies and draft blocks).
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
gpu_pytest "engine tests (small), new defaults" 240 tests/exl3/test_gpu.py -k "not 24gib"
wait_synth
if [ "$(left)" -gt 120 ]; then
  ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft gpu_pytest \
    "24 GiB, defaults (chunk 8192, draft graphs), tree-16 with graphs, 262K" $(( $(left) - 8 )) -s \
    "tests/exl3/test_gpu.py::test_24gib_budget_full_model[tree-16]"
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
