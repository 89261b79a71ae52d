#!/bin/bash
# Call 113 (session 25): the Gated DeltaNet tree kernel's rescheduling (see device_call112.sh), now also with
# every global load of the staging issued before its first shared store, and a warp's norm steps only over its
# own pairs.
# 1. as call 112: timelines of the new and the previous source (.device/gdn_prev.cu, d63cb6e's plus the clock
#    marks), gdn_vs_previous.py (bits and device time), the kernel's GPU tests;
# 2. the round: `elpis bench engine` of stock and elpis tree-16 at 1K and 8K with the new kernel, then elpis
#    alone with the previous source in its place, new, previous (a pooled A/B with ab_pooled.py).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
for which in new prev; do
  src=patches/kernels/gdn_tree.cu; [ $which = prev ] && src=.device/gdn_prev.cu
  echo "=== timeline $which ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 3 120 python3 elpis/bench/scripts/gdn_tree_timeline.py "$OUT/gdn-timeline-$which.json" "$src" 2>&1 \
    | grep -E '^\{|Error' | tee -a "$OUT/log"
done
wait_build
echo "=== gdn_vs_previous ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 200 python3 elpis/bench/scripts/gdn_vs_previous.py .device/gdn_prev.cu 2>&1 | grep -E 'GDNAB|Error' \
  | tee -a "$OUT/log"
gpu_pytest "gdn tree kernel" 150 tests/kernels/test_gdn_tree.py
wait_synth
cp patches/kernels/gdn_tree.cu /tmp/gdn_new.cu
engine_bench round-gdn-new-1 1 stock,elpis-tree16 12 3 "GDN tree kernel rescheduled"
cp .device/gdn_prev.cu patches/kernels/gdn_tree.cu
engine_bench round-gdn-prev-1 1 elpis-tree16 12 3 "GDN tree kernel before session 25"
cp /tmp/gdn_new.cu patches/kernels/gdn_tree.cu
engine_bench round-gdn-new-2 1 elpis-tree16 12 3 "GDN tree kernel rescheduled"
cp .device/gdn_prev.cu patches/kernels/gdn_tree.cu
engine_bench round-gdn-prev-2 1 elpis-tree16 12 3 "GDN tree kernel before session 25"
cp /tmp/gdn_new.cu patches/kernels/gdn_tree.cu
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
