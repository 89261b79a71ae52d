#!/bin/bash
# Call 24 (session 8): the served defaults after call 23 (2048-token prefill chunks again, see
# elpis/exl3/__init__.py; graph-replayed DFlash2 draft blocks) on the GPU. Run with run(carry=[".whl", ".device"]).
#  1. build and the full-size synthetic checkpoints (background);
#  2. tests/exl3/test_gpu.py on the small model but its 24 GiB tests (elpis == stock's Generator token for
#     token, draft on/off, prefix reuse exact, ...), with draft graphs on (the default);
#  3. the 24 GiB test at full size with the defaults (262,000-token prefill + 128 tokens under the cap,
#     tree-16 with graph-replayed verifies and draft blocks).
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
gpu_pytest "engine tests (small), defaults" 240 tests/exl3/test_gpu.py -k "not 24gib"
wait_synth
if [ "$(left)" -gt 120 ]; then
  ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft gpu_pytest \
    "24 GiB, defaults (draft graphs), tree-16 with graphs, 262K" $(( $(left) - 8 )) -s \
    "tests/exl3/test_gpu.py::test_24gib_budget_full_model[tree-16]"
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
