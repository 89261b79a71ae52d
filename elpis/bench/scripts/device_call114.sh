#!/bin/bash
# Call 114 (session 25): the Gated DeltaNet tree kernel as committed after calls 112-113 (call 112's rescheduling;
# the staging as before; up to 4 rows, one norm pair a warp), kernel only:
# 1. gdn_tree_timeline.py of it;
# 2. gdn_vs_previous.py against d63cb6e's source (.device/gdn_prev.cu) and against call 112's build
#    (.device/gdn_c112.cu): bits, and device time per call (48 calls a graph);
# 3. the kernel's GPU tests.
# Run with run(carry=[".whl", ".device", "build/kernels"]).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
( ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build ) > /tmp/build.log 2>&1 &
BUILD=$!
echo "=== timeline ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 120 python3 elpis/bench/scripts/gdn_tree_timeline.py "$OUT/gdn-timeline.json" 2>&1 \
  | grep -E '^\{|Error' | tee -a "$OUT/log"
wait $BUILD; tail -2 /tmp/build.log | tee -a "$OUT/log"
for prev in gdn_prev gdn_c112; do
  echo "=== gdn_vs_previous $prev ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 3 150 python3 elpis/bench/scripts/gdn_vs_previous.py .device/$prev.cu 2>&1 \
    | grep -E 'GDNAB \{"check": "(timing|summary)|Error' | tee -a "$OUT/log"
done
gpu_pytest "gdn tree kernel" 150 tests/kernels/test_gdn_tree.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
