#!/bin/bash
# Call 123 (staged in session 27 for the next session): issue 9's per-phase profile of the round as served now,
# stock and elpis tree-16 in the same run at 1K and 8K (eager tree verifies, as in call 103: the profiler opens its
# windows on forward calls, which a replayed graph does not make). The last profile is call 103's (session 24),
# before the Gated DeltaNet tree kernel's rescheduling (session 25). Set ELPIS_PATCH_EMBED_GATHER=1 in the command
# if call 122 turns the gather on. Commit profile.{json,md} under bench/results/profile/ with the call's log.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready
tree_profile 10
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
