#!/bin/bash
# Call 55 (issue 9, session 14): the gate projections kernel rewritten as spans of k (call 54's first version
# was slower than cuBLAS: 15.16 against 13.72 µs per layer at 16 rows, and no round gain).
# 1. GPU tests: the kernel (fp64 error next to hgemm, row invariance, refusals, timing over 48 layers' weights)
#    and the patch on the small model (marking, row invariance and lossless speculation through graphs);
# 2. the model gate under the pre-registered rule exl3-small-gdn-ba-r1 for the new code (its verdict is filed
#    here afterwards, as for call 54);
# 3. the pooled A/B of tree-16 rounds at 1K and 8K, alternating ELPIS_PATCH_GDN_BA=1 / 0, three runs each
#    (call 54's two per arm drowned in a noisy stretch: noise 7-10 ms).
# Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-580}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
( timeout -k 3 90 python3 -m elpis.cli dequantize --model /tmp/small/target --out /tmp/small-deq ) > /tmp/deq.log 2>&1 &
DEQ=$!
gpu_pytest "gdn ba kernel tests" 90 tests/kernels/test_gdn_ba.py
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "gdn ba patch tests" 200 tests/exl3/test_gdn_ba_patch.py
wait "$DEQ"; tail -2 /tmp/deq.log | tee -a "$OUT/log"
rows=$(python3 -c "from elpis.exl3.gate import code_digest; print(code_digest(['rows-gemm']))")
both=$(python3 -c "from elpis.exl3.gate import code_digest; print(code_digest(['gdn-ba', 'rows-gemm']))")
ELPIS_PATCH_ROWS_GEMM=1 ELPIS_PATCH_GDN_BA=1 model_gate gdn-ba-spans \
  "floor-served=exl3:code=$rows,patches=gdn-state-fp32+rows-gemm+tree-verify,rows=8" \
  "floor-stock=exl3:patches=none,rows=8" \
  "gdn-ba=exl3:code=$both,patches=gdn-ba+gdn-state-fp32+rows-gemm+tree-verify,rows=8"
wait_synth
export BENCH_MARGIN=10
title="issue 9: gdn ba (spans) pooled A/B"
for i in 1 2 3; do
  ELPIS_PATCH_GDN_BA=1 engine_bench ba-a$i 1 elpis-tree16 16 8 "$title (ba-a$i), H200"
  ELPIS_PATCH_GDN_BA=0 engine_bench ba-b$i 1 elpis-tree16 16 8 "$title (ba-b$i), H200"
done
rm -f "$OUT"/*.png
python3 elpis/bench/scripts/ab_pooled.py elpis-tree16 "$OUT/ba-pooled.json" --a "$OUT"/ba-a?.json \
  --b "$OUT"/ba-b?.json 2>&1 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
