#!/bin/bash
# Call 99 (session 23): the tensor-core tree attention starts its blocks longest split first (grid: heads, then
# splits last to first). Call 98 found the graded layout 28 % slower than the uniform one at 32K, whose 16-tile
# blocks, last in the grid, ran alone at the end; only the block-to-split map changes (bit for bit under the CPU
# emulation against 88983a4's source).
# 1. mma_vs_previous.py against 88983a4's kernel (.device/mma_prev.cu): every output and LSE bit, and times;
# 2. attention_splits.py: the served kernel against the previous 512-position layout (.device/schedule-512),
#    graph form, 1K-262K (call 98 ran the same with the split-order grid);
# 3. one `elpis bench engine` of elpis tree-16 as served (stock does not fit in the device time left; call 98
#    measured it beside the split-order grid).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set; LIMIT fits the device time left.
LIMIT=${LIMIT:-430}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
echo "=== attention: longest split first against 88983a4 ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 90 python3 elpis/bench/scripts/mma_vs_previous.py .device/mma_prev.cu 2>&1 | tee "$OUT/mma-vs-previous.txt" \
  | grep -E 'timing|failures|Error' | tee -a "$OUT/log"
echo "=== attention layouts ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 90 python3 elpis/bench/scripts/attention_splits.py "$OUT/attention-layouts.json" \
  previous=.device/schedule-512 2>&1 | grep -E '^\{|Error' | tee -a "$OUT/log"
wait_synth
export BENCH_MARGIN=8
engine_bench same 1 elpis-tree16 12 3 "elpis tree-16, attention longest split first (call 99), H200"
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
