#!/bin/bash
# Call 213 (session 55), chained on call 212's warm machine (its build and /tmp/full kept): stock beside tree-8
# and tree-16 at 1K and 8K with the session's code, the same-run comparison the README's table cites.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-400}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_once
start_full_synth
finish_full_synth
systems_bench systems-1k8k-call213 8 "stock beside tree-8 and tree-16 (session 55)" stock,elpis-tree8,elpis-tree16
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
