#!/bin/bash
# Runs at 5c5e0e4 or earlier only: the long form was removed after call 196 (bench/results/tree/README.md, session 48).
# Call 196 (session 48; a fresh machine): the long-context tree attention after call 195 found it slower than the
# served fold build at 8-16 rows (262K, 8 rows: 1.20 against 0.91 ms). Changed since: K and V decoded in fp16
# pairs (HSUB2/HMUL2, exact whenever the step is an fp16; fp32 otherwise), each tile's incoming max folded by its
# own score warps (no statistics pass and no barrier between the scores and P), per-tile active rows computed
# once a pass, and one score warp per 16 positions taking every row (ELPIS_LONG_SCORE_CLASSES 1; 2 is call 195's
# K decoded by two warps). Bits against the served build and timings, then the builds with 2 classes and with 2-tile passes
# against the default, then the GPU tests.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_once
echo "=== attention: long form against the served fold build ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 150 python3 elpis/bench/scripts/mma_vs_previous.py --new-long patches/kernels/tree_attention_mma.cu \
  1000 4093 32760 131050 262000 2>&1 | tee "$OUT/long-vs-served.txt" | grep -E 'timing|failures|Error|false' \
  | tee -a "$OUT/log"
sed "s/^#define ELPIS_LONG_SCORE_CLASSES 1$/#define ELPIS_LONG_SCORE_CLASSES 2/" patches/kernels/tree_attention_long.cu \
  > patches/kernels/long_classes2.cu
grep -c "^#define ELPIS_LONG_SCORE_CLASSES 2$" patches/kernels/long_classes2.cu | tee -a "$OUT/log"
echo "=== attention: long form (1 class) against 2 classes ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 120 python3 elpis/bench/scripts/mma_vs_previous.py --new-long patches/kernels/long_classes2.cu \
  32760 262000 2>&1 | tee "$OUT/long-vs-classes2.txt" | grep -E 'timing|failures|Error|false' | tee -a "$OUT/log"
sed "s/^#define ELPIS_LONG_TILES 4$/#define ELPIS_LONG_TILES 2/" patches/kernels/tree_attention_long.cu \
  > patches/kernels/long_tiles2.cu
grep -c "^#define ELPIS_LONG_TILES 2$" patches/kernels/long_tiles2.cu | tee -a "$OUT/log"
echo "=== attention: long form (4-tile passes) against 2-tile passes ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 120 python3 elpis/bench/scripts/mma_vs_previous.py --new-long patches/kernels/long_tiles2.cu \
  262000 2>&1 | tee "$OUT/long-vs-tiles2.txt" | grep -E 'timing|failures|Error|false' | tee -a "$OUT/log"
rm -f patches/kernels/long_classes2.cu patches/kernels/long_tiles2.cu
# Nsight Compute on one warm 262K launch of each (1 and 8 rows): why one row costs the same ~0.7 ms in two unlike
# kernels (call 195), ~9x the 3-bit cache's read
for spec in "long 1" "long 8" "mma 1"; do
  set -- $spec
  [ "$(left)" -gt 110 ] || break
  echo "=== ncu $1, 262K, $2 rows ($(left) s left)" | tee -a "$OUT/log"
  ELPIS_NCU_LONG=$([ "$1" = long ] && echo 1 || echo 0) timeout 90 ncu --kernel-name "regex:tree_attention_$1_split" \
    --launch-skip 2 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section SchedulerStats --section WarpStateStats --section LaunchStats \
    python3 elpis/bench/scripts/mma_ncu.py 262000 "$2" 3 > "$OUT/ncu-$1-$2.txt" 2>&1
  echo "ncu exit $?" | tee -a "$OUT/log"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|Registers Per" \
    "$OUT/ncu-$1-$2.txt" | head -12 | tee -a "$OUT/log"
done
gpu_pytest "long form: bits against the fold build" $(( $(left) - 30 )) tests/kernels/test_tree_attention_long.py
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
