#!/bin/bash
# Call 49 (issue 9, session 13): the GDN tree kernel with its global loads issued before its shared stores
# (phase A stages each channel's input rows; the state slice is loaded into registers first).
# 1. gdn_vs_previous.py against the source before the change (.device/gdn_tree_prev.cu = git show
#    295c2a1:patches/kernels/gdn_tree.cu): bit for bit on random trees, and device time per call;
# 2. the kernel's GPU tests and the tree-mode lossless tests on the small model;
# 3. `elpis bench profile` of stock and elpis-tree16 at 1K and 8K (eager tree verifies), now with the most
#    expensive kernels by name per phase.
# Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-580}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
echo "=== gdn vs previous ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 150 python3 elpis/bench/scripts/gdn_vs_previous.py .device/gdn_tree_prev.cu > "$OUT/gdnab.txt" 2>&1
echo "gdn vs previous: exit $?" | tee -a "$OUT/log"
grep "^GDNAB" "$OUT/gdnab.txt" | grep -v '"identical": true' | tee -a "$OUT/log"
gpu_pytest "gdn tree kernel tests" 120 tests/kernels/test_gdn_tree.py
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "tree verify tests" 150 tests/exl3/test_tree_verify.py
wait_synth
tree_profile 15
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
