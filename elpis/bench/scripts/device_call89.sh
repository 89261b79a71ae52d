#!/bin/bash
# Call 89 (session 21): call 88's batched fold took the last block's sum from 8.3 to 1.3 us (MLP down) and a
# 16-row verify's GEMMs from 11.61 to 11.15 ms, but the MLP gate/up call grew 2.3 us and every main loop ~4 %
# in the timeline; the loop's SASS is the same work, scheduled differently. Three forms of the same fold:
#   ELPIS_GEMM_FOLD 2  batched, inlined (call 88), twice (the second run is the noise reference);
#   ELPIS_GEMM_FOLD 3  batched, a separate (noinline) function, so the kernel body compiles without it;
#   ELPIS_GEMM_FOLD 4  call 86's per-output loop, its eight loads volatile and unconditional.
# rows_gemm_variants.py against .device/prev_gemm.cu; the timeline with FOLD 3; GPU tests of the kernel.
# The first run's variants failed (two threads built fold2's one library under one temporary name; fixed in
# elpis.nvcc); its FOLD 3 timeline ran: main loops ~2-3 us slower than FOLD 2's. The second run (PART=2) times
# the served source twice (noise reference), FOLD 2 and FOLD 4.
# No `make build` on the device: carry [".whl", ".device", "build/kernels"].
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
echo "=== rows GEMM: fold forms ($(left) s left)" | tee -a "$OUT/log"
if [ "${PART:-1}" = 2 ]; then
  timeout -k 5 300 python3 elpis/bench/scripts/rows_gemm_variants.py .device/prev_gemm.cu "$OUT/variants.json" \
    served= fold2=ELPIS_GEMM_FOLD:2 fold4=ELPIS_GEMM_FOLD:4 served2= 2>&1 | tail -18 | tee -a "$OUT/log"
else
  timeout -k 5 300 python3 elpis/bench/scripts/rows_gemm_variants.py .device/prev_gemm.cu "$OUT/variants.json" \
    served= fold2=ELPIS_GEMM_FOLD:2 fold3=ELPIS_GEMM_FOLD:3 fold4=ELPIS_GEMM_FOLD:4 fold2b=ELPIS_GEMM_FOLD:2 \
    2>&1 | tail -18 | tee -a "$OUT/log"
  echo "=== rows GEMM timeline [FOLD 3] ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 5 120 python3 elpis/bench/scripts/rows_gemm_timeline.py "$OUT/timeline-fold3.json" ELPIS_GEMM_FOLD:3 2>&1 \
    | grep -v late_blocks | cut -c1-700 | tail -9 | tee -a "$OUT/log"
fi
gpu_pytest "rows GEMM kernel" $(( $(left) - 15 )) tests/kernels/test_rows_gemm.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
