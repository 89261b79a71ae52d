#!/bin/bash
# Call 93 (staged in session 21, ran in session 22 at 032be7b; the knob was removed after it: 8 rows 1.5 % faster,
# 16 rows 3.3 % slower, bench/results/rows_gemm/README.md session 22). The rows GEMM's pipeline across n-blocks
# (ELPIS_GEMM_PREFETCH_NEXT): a block's last main-loop pass over one n-block loads the next n-block's first stages
# before the warps' sums, so they are in flight while this n-block's partials are summed, written and folded.
# Same adds in the same order (bit for bit the served build under the CPU emulation). The served build's SASS does
# not change with the knob off.
# 1. rows_gemm_variants.py against the served source (served twice, the knob on);
# 2. rows_gemm_timeline.py with the knob on (compare with call 88's FOLD 2 timeline).
# Before it: `git show HEAD:patches/kernels/exl3_gemm_rows.cu > .device/served_gemm.cu`.
# No `make build` on the device: carry [".whl", ".device", "build/kernels"].
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
echo "=== rows GEMM: pipeline across n-blocks ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 300 python3 elpis/bench/scripts/rows_gemm_variants.py .device/served_gemm.cu "$OUT/variants.json" \
  served= prefetch=ELPIS_GEMM_PREFETCH_NEXT:1 served2= 2>&1 | tail -18 | tee -a "$OUT/log"
echo "=== rows GEMM timeline [PREFETCH_NEXT] ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 120 python3 elpis/bench/scripts/rows_gemm_timeline.py "$OUT/timeline-prefetch.json" \
  ELPIS_GEMM_PREFETCH_NEXT:1 2>&1 | grep -v late_blocks | cut -c1-700 | tail -9 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
