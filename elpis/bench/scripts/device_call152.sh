#!/bin/bash
# Call 152 (session 40; chained onto call 151's warm machine, which keeps /tmp/full and the build): the switches
# call 151's in-process A/Bs found faster, with the served defaults beside stock in one `elpis bench engine` run,
# and inside the 24 GiB cap at 262,000 tokens before any of them is turned on by default.
# SWITCHES: the registry switch variables to set to 1 (space-separated, e.g. "ELPIS_PATCH_NORM_INPUT
# ELPIS_PATCH_DRAFT_CANDIDATES"); empty runs the defaults alone.
# 1. engine bench: stock chain-8 and elpis tree-16 at 1K and 8K, 12 rounds after 3, with SWITCHES on;
# 2. the 24 GiB test at 262,000 tokens, tree-16, with SWITCHES on.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION, SWITCHES set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_full_synth
for var in ${SWITCHES:-}; do export "$var=1"; done
echo "switches on: ${SWITCHES:-none}" | tee -a "$OUT/log"
BENCH_MARGIN=200 engine_bench round-1k8k-call152 1 stock,elpis-tree16 12 3 "elpis tree-16 (${SWITCHES:-defaults}), H200"
rm -f "$OUT"/*.png
[ "$(left)" -gt 150 ] && gib24_test "with ${SWITCHES:-the defaults}"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
