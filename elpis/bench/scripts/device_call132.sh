#!/bin/bash
# Call 132 (session 31): the split-warp tree attention under the served configuration's memory test and the
# kernels' whole GPU suite.
# 1. `pytest -m gpu tests/kernels` (every kernel's GPU tests, the tree attention's among them);
# 2. the 24 GiB test at 262,000 tokens, tree-16 with graphs captured at load (272 replays over the 262K cache).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-500}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
gpu_pytest "kernels' GPU tests" 150 tests/kernels
wait_synth
gib24_test "tree-16, split-warp attention" $(( $(left) - 10 ))
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
