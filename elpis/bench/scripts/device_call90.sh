#!/bin/bash
# Call 90 (session 21): the served defaults against stock after the rows GEMM's batched fold (calls 88-89).
# 1. three same-run `elpis bench engine` runs of stock chain-8 and elpis tree-16 at 1K and 8K (16 rounds after 4
#    warm-up each), pooled per system (`ab_pooled.py`);
# 2. GPU tests of the kernel and of the patch in the engine (tree verifies through it, row invariance).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set; at most 8 files come back (packed).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready
export BENCH_MARGIN=170  # each run stops early enough to leave the tests their time
for i in 1 2 3; do
  engine_bench same$i 1 stock,elpis-tree16 16 4 "Stock chain-8 vs elpis tree-16 (call 90, run $i), H200"
done
rm -f "$OUT"/*.png
python3 elpis/bench/scripts/ab_pooled.py elpis-tree16 "$OUT/same-pooled.json" --a "$OUT"/same?.json \
  --b "$OUT"/same?.json --b-system stock 2>&1 | tee -a "$OUT/log"
grep -h -A4 "Disturbed" "$OUT"/same?.md | tee -a "$OUT/log"
gpu_pytest "rows GEMM kernel and patch" $(( $(left) - 15 )) tests/kernels/test_rows_gemm.py \
  tests/exl3/test_rows_gemm_patch.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
