#!/bin/bash
# Call 145 (session 36): call 144 traced the round tail's refusals on the GPU to gdn_tree_commit_plan (status
# -1138: round_tail.cu line 138) at -O3 and with ptxas at -O0, not at -G, while the acceptor's two poisoned
# runs agree with the CPU's. round_tail_diag.py now also runs each path's commit plan on the GPU three ways
# (gdn_tree_commit_plan, gdn_tree_plan with the chain's masks from global memory, the generated elpis_gdn_plan
# raw) for each build, against the host's packed plan ("CPDIAG" lines), before the round cases.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_once
echo "=== commit plan and round tail diagnosis ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 150 python3 elpis/bench/scripts/round_tail_diag.py > "$OUT/round_tail_diag.txt" 2>&1
echo "diag: exit $?" | tee -a "$OUT/log"
grep -E "^CPDIAG|^RTDIAG|Error" "$OUT/round_tail_diag.txt" | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
