#!/bin/bash
# Call 199 (session 49; a fresh machine, LIMIT ~240): the rows GEMM with a launch bound of three blocks a
# multiprocessor (ELPIS_GEMM_MIN_BLOCKS=3: 80 registers a thread; the 8-row 4-bit kernel fits them without a spill,
# the 16-row ones spill 344-356 bytes) against the served two, on one verify's calls at 8 and 16 rows
# (rows_gemm_variants.py). Its stream-K grid is 3 x SMs blocks, another partition, so its bits differ by design;
# this is a timing probe for a change that would need a gate verdict. Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-240}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_once
echo "=== rows GEMM: three blocks a multiprocessor ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 $(( $(left) - 10 )) python3 elpis/bench/scripts/rows_gemm_variants.py patches/kernels/exl3_gemm_rows.cu \
  "$OUT/gemm-min3.json" served= min3=ELPIS_GEMM_MIN_BLOCKS:3 2>&1 | tee "$OUT/gemm-min3.txt" | tail -30 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
