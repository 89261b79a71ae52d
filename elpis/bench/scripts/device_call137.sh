#!/bin/bash
# Call 137 (staged in session 32 for the next session; needs .device/ext.so.xz.part-*, see device_common.sh):
# 1. ELPIS_MMA_ROW_LAYOUT 1 and 2 (patches/kernels/tree_attention_mma.cu; 0 is served): past 8 rows the V-staging
#    warps take every second row once V is staged (1), or every warp takes one row and every thread half a V
#    group (2). Call 136 found the staging warps waiting at the barrier for 16 % of the samples, and two-row
#    score warps loading no fragment ahead. A copy of the source per layout is checked bit for bit and timed
#    beside the served build (mma_vs_previous.py: "previous" is the variant);
# 2. the round at 262K with the served kernel (b032579's score_softmax), stock chain-8 in the same run, as call
#    130 measured it (38.30 / 46.44 ms).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
wait_synth  # nothing else on the GPU while the kernels are timed
for layout in 1 2; do
  sed "s/^#define ELPIS_MMA_ROW_LAYOUT 0$/#define ELPIS_MMA_ROW_LAYOUT $layout/" patches/kernels/tree_attention_mma.cu \
    > .device/mma_layout$layout.cu
  grep -c "^#define ELPIS_MMA_ROW_LAYOUT $layout$" .device/mma_layout$layout.cu | tee -a "$OUT/log"
  echo "=== attention: served against row layout $layout ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 3 80 python3 elpis/bench/scripts/mma_vs_previous.py .device/mma_layout$layout.cu 32760 131050 262128 \
    2>&1 | tee "$OUT/mma-vs-layout$layout.txt" | grep -E 'timing|failures|Error|false' | tee -a "$OUT/log"
done
echo "=== bench 262K ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 10 )) python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
  --systems stock,elpis-tree16 --checkpoints 262000 --rounds 8 --warmup 2 --final-tokens 0 --spec-only \
  --time-limit $(( $(left) - 20 )) --out-dir "$OUT" --stem round-262k --title "round at 262K, score_softmax" \
  > "$OUT/round-262k.txt" 2>&1
echo "bench exit $?" | tee -a "$OUT/log"
grep -E "^\| " "$OUT/round-262k.md" 2>/dev/null | head -12 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
