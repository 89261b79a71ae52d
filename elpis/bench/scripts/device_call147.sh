#!/bin/bash
# Call 147 (staged in session 36 for the next session). Calls 144-146 traced the round tail's refusals on the
# H200 to gdn_tree_commit_plan in the tail (round_tail.cu line 138). The acceptor's poisoned runs agree with the
# CPU's. The plan is right when given a path from global memory, at -O3 too, and the out-of-line variant
# (call 146) still refused. round_tail_diag.py now also runs the tail's own steps with every intermediate
# written out ("TSDIAG": the acceptor's code and path, then the plan's code into a shared plan, a local plan,
# and from the path copied through global memory), per build.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_once
echo "=== round tail steps ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 150 python3 elpis/bench/scripts/round_tail_diag.py > "$OUT/round_tail_diag.txt" 2>&1
echo "diag: exit $?" | tee -a "$OUT/log"
grep -E "^TSDIAG|^RTDIAG|Error" "$OUT/round_tail_diag.txt" | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
