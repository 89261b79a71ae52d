#!/bin/bash
# Call 82 (session 20), chained right after device_ext_build.sh (call 81) on the warm machine:
# 1. rows_gemm_variants.py: the rows GEMM with an n-block's tiles dealt to 2 or 4 warps per k-tile
#    (ELPIS_GEMM_SPLIT), 1 or 2 blocks per multiprocessor and 2-4 stages, against the previous source
#    (.device/prev_gemm.cu, HEAD's before the knob) on every call of a verify at 8 and 16 rows: bitwise
#    equality, fp64 error, time per call and per verify.
# 2. GPU tests: the verify gate (its round helper changed after call 76) and the rows GEMM's kernel tests.
# Run with run(carry=[".whl", ".device"]). A record: it ran at f049d5e, whose kernel had the split knob and whose
# rows_gemm_variants.py took NAME=SPLIT,MIN_BLOCKS,STAGES (both changed since; the knob is gone).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready
echo "=== rows GEMM variants ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 300 python3 elpis/bench/scripts/rows_gemm_variants.py .device/prev_gemm.cu "$OUT/variants.json" \
  s1=1,2,3 s2=2,2,3 s2st2=2,2,2 s2m1=2,1,3 s2m1st4=2,1,4 s4m1=4,1,3 2>&1 | tail -24 | tee -a "$OUT/log"
[ -f /tmp/small/target/config.json ] || timeout -k 2 60 python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "verify gate; rows GEMM kernel" $(( $(left) - 15 )) \
  tests/exl3/test_verify_gate.py tests/kernels/test_rows_gemm.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
