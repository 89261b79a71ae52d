#!/bin/bash
# Call 28: the served defaults with the rewritten tensor-core tree attention (calls 26-27; bit-identical to the
# source at 3ccd438 on every checked configuration): tests/exl3/test_gpu.py on the small model but its 24 GiB
# tests, then the 24 GiB test at full size with tree-16 (what `elpis serve --backend exl3 --draft DIR` now loads
# by default: 262,000-token prefill + 128 tokens under the cap, graph-replayed verifies and draft blocks).
# Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-580}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
gpu_pytest "engine tests (small), defaults" 200 tests/exl3/test_gpu.py -k "not 24gib"
wait_synth
if [ "$(left)" -gt 120 ]; then
  ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft gpu_pytest \
    "24 GiB, tree-16 (the served default with a draft), 262K" $(( $(left) - 8 )) -s \
    "tests/exl3/test_gpu.py::test_24gib_budget_full_model[tree-16]"
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
