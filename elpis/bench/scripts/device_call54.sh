#!/bin/bash
# Call 54 (issue 9, written in session 13 for the next session): the patch exl3-gdn-ba (off), everything its
# default needs, in the order its rule and the registry ask.
# 1. GPU tests: the kernel (tests/kernels/test_gdn_ba.py: fp64 error next to ExLlamaV3's hgemm, row invariance,
#    timing) and the patch on the small model (tests/exl3/test_gdn_ba_patch.py: marking, the kernel called,
#    row invariance and lossless speculation through graphs, the product path, logits against cuBLAS logged);
# 2. the model gate under the pre-registered rule exl3-small-gdn-ba-r1 (floors: the served tree mode with the
#    rows GEMM at code 5e94bc9434c1, stock; the candidate adds gdn-ba); the verdict is filed here afterwards
#    (`elpis gate verdict --rules elpis/gate/rules/exl3-small-gdn-ba-r1.toml --measurement
#    bench/results/gate/model-gdn-ba-*.json --candidate gdn-ba --patch exl3-gdn-ba`, with the ledger lines
#    copied into bench/results/gate/ledger.jsonl: the rule's commit time comes from git, which the device
#    machine's copy does not have);
# 3. the pooled A/B of tree-16 rounds at 1K and 8K, alternating ELPIS_PATCH_GDN_BA=1 / 0, two runs each.
# Before the default can change, the 24 GiB test must pass with it too (its weights add ~47 MB):
# `ELPIS_PATCH_GDN_BA=1 LIMIT=262 bash elpis/bench/scripts/device_call44.sh` (about 4 minutes on a fresh machine).
# Run with run(carry=[".whl", ".device"]); if the time runs short, split 3 into its own call.
LIMIT=${LIMIT:-580}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
( timeout -k 3 90 python3 -m elpis.cli dequantize --model /tmp/small/target --out /tmp/small-deq ) > /tmp/deq.log 2>&1 &
DEQ=$!
gpu_pytest "gdn ba kernel tests" 90 tests/kernels/test_gdn_ba.py
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "gdn ba patch, draft and tree graph tests" 300 tests/exl3/test_gdn_ba_patch.py \
  tests/exl3/test_draft_graph.py tests/exl3/test_tree_graph.py  # the latter two: a280af1's refactor, not yet run
wait "$DEQ"; tail -2 /tmp/deq.log | tee -a "$OUT/log"
rows=$(python3 -c "from elpis.exl3.gate import code_digest; print(code_digest(['rows-gemm']))")
both=$(python3 -c "from elpis.exl3.gate import code_digest; print(code_digest(['gdn-ba', 'rows-gemm']))")
ELPIS_PATCH_ROWS_GEMM=1 ELPIS_PATCH_GDN_BA=1 model_gate gdn-ba \
  "floor-served=exl3:code=$rows,patches=gdn-state-fp32+rows-gemm+tree-verify,rows=8" \
  "floor-stock=exl3:patches=none,rows=8" \
  "gdn-ba=exl3:code=$both,patches=gdn-ba+gdn-state-fp32+rows-gemm+tree-verify,rows=8"
wait_synth
export BENCH_MARGIN=10
title="issue 9: gdn ba pooled A/B"
ELPIS_PATCH_GDN_BA=1 engine_bench ba-a1 1 elpis-tree16 16 8 "$title (ba-a1), H200"
ELPIS_PATCH_GDN_BA=0 engine_bench ba-b1 1 elpis-tree16 16 8 "$title (ba-b1), H200"
ELPIS_PATCH_GDN_BA=1 engine_bench ba-a2 1 elpis-tree16 16 8 "$title (ba-a2), H200"
ELPIS_PATCH_GDN_BA=0 engine_bench ba-b2 1 elpis-tree16 16 8 "$title (ba-b2), H200"
rm -f "$OUT"/*.png
python3 elpis/bench/scripts/ab_pooled.py elpis-tree16 "$OUT/ba-pooled.json" --a "$OUT"/ba-a?.json \
  --b "$OUT"/ba-b?.json 2>&1 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
