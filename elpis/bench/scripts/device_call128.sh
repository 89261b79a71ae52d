#!/bin/bash
# Call 128 (session 31): the tree attention overlaps its staging with the tensor-core phases below ctx (K and V
# in staged rows of their own: V dequantised while the scores read K, the next K while the output reads V; three
# barriers a tile instead of four). Call 127's clocks: at 16 rows a 262K tile is 11,647 cycles, ~3,300 of them
# staging that nothing overlapped (one block per SM).
# 1. mma_vs_previous.py against 6c3389c's kernel (.device/mma_prev.cu): every output and LSE bit at 1K-262K,
#    1-16 rows, and times from 32K (1, 8, 16 rows);
# 2. the same with a variant whose warps all stage after the scores and the output (no interleaving), at 128K
#    and 262K: whether the odd/even order matters;
# 3. the attention kernels' GPU tests (row invariance against plain decoding, fp64 error, staged == direct);
# 4. phase clocks at 262K.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log | tee -a "$OUT/log"; exit 1; }
tail -2 /tmp/build.log | tee -a "$OUT/log"
echo "=== attention: overlapped staging against 6c3389c ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 200 python3 elpis/bench/scripts/mma_vs_previous.py .device/mma_prev.cu 1000 4093 32760 131050 262128 \
  2>&1 | tee "$OUT/mma-vs-previous.txt" | grep -E 'timing|failures|Error|false' | tee -a "$OUT/log"
sed 's/const bool stage_first = (warp \& 1u) != 0u;/const bool stage_first = false;/' \
  patches/kernels/tree_attention_mma.cu > patches/kernels/tree_attention_mma_variant.cu
grep -c "stage_first = false" patches/kernels/tree_attention_mma_variant.cu | tee -a "$OUT/log"
echo "=== attention: against the variant that stages last in every warp ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 100 python3 elpis/bench/scripts/mma_vs_previous.py patches/kernels/tree_attention_mma_variant.cu \
  131050 262128 2>&1 | tee "$OUT/mma-vs-variant.txt" | grep -E 'timing|failures|Error|false' | tee -a "$OUT/log"
rm -f patches/kernels/tree_attention_mma_variant.cu
gpu_pytest "attention kernel GPU tests" 120 tests/kernels/test_tree_attention_mma.py
echo "=== phase clocks ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 $(( $(left) - 10 )) python3 elpis/bench/scripts/mma_phase_clocks.py 262128 2>&1 | grep -v Warning \
  | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
