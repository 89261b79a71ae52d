#!/bin/bash
# Call 126 (session 30): the 24 GiB test at HEAD on the full-size synthetic checkpoints, the server's default
# (tree-16, graphs captured at load: 262,000-token prefill and decode under a 24 GiB cap), then the chain-8
# variant if time is left. Completes call 125's whole-suite run (its 24 GiB tests skip without the checkpoints).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
wait_synth
gib24_test "tree-16 at HEAD" $(( $(left) - 20 ))
[ "$(left)" -gt 200 ] && gib24_test "chain-8 at HEAD" $(( $(left) - 10 )) chain-8
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
