#!/bin/bash
# Call 103 (staged in session 23 for the next session; no device time was left): issue 9's per-phase profile of
# the round as served now (the last one is call 60, session 15, before the fold, the graded attention splits,
# the in-place qkv read and the gate projections kernel), stock and elpis tree-16 in the same run at 1K and 8K
# (eager tree verifies: the profiler opens its windows on forward calls, which a replayed graph does not make).
# Commit profile.{json,md} under bench/results/profile/ with the call's log.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready
tree_profile 10
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
