#!/bin/bash
# Call 148 (staged in session 37; after calls 147 and 143 pass): the 24 GiB test at 262,000 tokens with greedy
# rounds on the GPU (test_24gib_budget_full_model[tree-16-device-rounds]: `exl3-device-rounds` and
# `exl3-embed-gather` on, the served generator, trees of the draft's top-4), so the rounds' graphs, state blocks
# and record slots are inside the cap before the switch can be turned on; then the host-rounds tree-16 test in
# the same call for the peak beside it. Chained onto call 147's or 143's warm machine it reuses /tmp/full.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_full_synth
gib24_test "rounds on the GPU" 300 tree-16-device-rounds
[ "$(left)" -gt 200 ] && gib24_test "host rounds, beside it"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
