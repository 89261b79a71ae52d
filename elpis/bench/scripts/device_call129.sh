#!/bin/bash
# Call 129 (session 31): below ctx the tree attention now splits its warps: warps 0..7 compute the scores and P of
# whole rows (both 16-position halves of a tile from each k-step's fragments: 25 % fewer shared-memory bytes, and
# no barrier between the scores and P), warps 8..15 dequantise V meanwhile; every warp then runs the output and
# stages the next K. Two barriers a tile (call 128's build: three, four before).
# 1. mma_vs_previous.py against 6c3389c's kernel (.device/mma_prev.cu): every output and LSE bit at 1K-262K,
#    1-16 rows, and times from 32K;
# 2. the same against call 128's build (.device/mma_call128.cu) at 128K and 262K;
# 3. the attention kernels' GPU tests; 4. phase clocks at 262K.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log | tee -a "$OUT/log"; exit 1; }
tail -1 /tmp/build.log | tee -a "$OUT/log"
echo "=== attention: split warps against 6c3389c ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 200 python3 elpis/bench/scripts/mma_vs_previous.py .device/mma_prev.cu 1000 4093 32760 131050 262128 \
  2>&1 | tee "$OUT/mma-vs-previous.txt" | grep -E 'timing|failures|Error|false' | tee -a "$OUT/log"
echo "=== attention: split warps against call 128's build ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 100 python3 elpis/bench/scripts/mma_vs_previous.py .device/mma_call128.cu 131050 262128 2>&1 \
  | tee "$OUT/mma-vs-call128.txt" | grep -E 'timing|failures|Error|false' | tee -a "$OUT/log"
gpu_pytest "attention kernel GPU tests" 120 tests/kernels/test_tree_attention_mma.py
echo "=== phase clocks ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 $(( $(left) - 10 )) python3 elpis/bench/scripts/mma_phase_clocks.py 262128 2>&1 | grep -v Warning \
  | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
