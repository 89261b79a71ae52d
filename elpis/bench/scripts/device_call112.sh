#!/bin/bash
# Call 112 (session 25): the Gated DeltaNet tree kernel, phase by phase, before and after a rescheduling that
# keeps every operation of every value (patches/kernels/gdn_tree.cu: the v channels convolved by the whole block
# after the first barrier instead of by half of warp 0 after its q/k rows; the warp's L2 norms stepped together;
# a visit's output sum finished in the next visit's butterfly, beside its dot product).
# 1. gdn_tree_timeline.py (ELPIS_GDN_CLOCKS builds) of the new source and of the previous one (.device/gdn_prev.cu:
#    d63cb6e's source plus the same clock marks, its PTX otherwise unchanged);
# 2. gdn_vs_previous.py: bits of verify outputs, committed state and conv window against the previous build,
#    random trees of 1-16 rows, and device time per call (48 calls a graph);
# 3. the kernel's GPU tests (fp64 error, row invariance, commit = one token at a time).
# Run with run(carry=[".whl", ".device", "build/kernels"]).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
( ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build ) > /tmp/build.log 2>&1 &
BUILD=$!
for which in new prev; do
  src=patches/kernels/gdn_tree.cu; [ $which = prev ] && src=.device/gdn_prev.cu
  echo "=== timeline $which ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 3 120 python3 elpis/bench/scripts/gdn_tree_timeline.py "$OUT/gdn-timeline-$which.json" "$src" 2>&1 \
    | grep -E '^\{|Error' | tee -a "$OUT/log"
done
wait $BUILD; tail -2 /tmp/build.log | tee -a "$OUT/log"
echo "=== gdn_vs_previous ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 200 python3 elpis/bench/scripts/gdn_vs_previous.py .device/gdn_prev.cu 2>&1 | grep -E 'GDNAB|Error' \
  | tee -a "$OUT/log"
gpu_pytest "gdn tree kernel" 150 tests/kernels/test_gdn_tree.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
