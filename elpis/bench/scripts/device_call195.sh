#!/bin/bash
# Runs at 5c5e0e4 or earlier only: the long form was removed after call 196 (bench/results/tree/README.md, session 48).
# Call 195 (session 48; a fresh machine, LIMIT ~590): the long-context form of the fold build's tree attention
# (patches/kernels/tree_attention_long.cu: the cache's values decoded straight into the tensor cores' fragments,
# 128-position passes, cp.async staging of the packed words). The emulated tests compare it with the served fold
# build bit for bit on the CPU; here:
# 1. mma_vs_previous.py --new-long against the served source: bits at 1K-262K with 1-16 rows (random trees), then
#    both timed at 32K, 128K and 262K with 1, 8 and 16 rows (median of 30 CUDA-event times, each call's host
#    checks included on both sides);
# 2. tests/kernels/test_tree_attention_long.py (bits at every kind of split boundary, 262K, the graph form);
# 3. the Triton and autotune caches back through $OUT for the next calls' carry.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_once
echo "=== attention: long form against the served fold build ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 240 python3 elpis/bench/scripts/mma_vs_previous.py --new-long patches/kernels/tree_attention_mma.cu \
  1000 4093 32760 131050 262000 2>&1 | tee "$OUT/long-vs-served.txt" | grep -E 'timing|failures|Error|false' \
  | tee -a "$OUT/log"
gpu_pytest "long form: bits against the fold build" $(( $(left) - 40 )) tests/kernels/test_tree_attention_long.py
pack_outputs
save_caches >/dev/null
ls "$OUT"/caches.tar.xz.part-* | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
