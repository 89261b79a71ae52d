#!/bin/bash
# Call 70 (written in session 17 for the next session): what session 17 could not run on the GPU.
# 1. The 24 GiB test at 262,000 tokens (tree-16) with the graphs now captured at load (+0.43 GiB at full
#    size, call 67): the peak under the cap;
# 2. the disk tier across a restart (it now settles background snapshot copies before persisting), alone
#    and with time (calls 65 and 69 cut it off at 150 s inside a group of tests).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set; call 71 (the fresh-TTFT bench) follows.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "disk tier across a restart" 200 \
  "tests/exl3/test_gpu.py::test_restart_reuses_disk_prefix"
wait_synth
gib24_test "tree-16, graphs captured at load, prefill groups of 4, 262K"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
