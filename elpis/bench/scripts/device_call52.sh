#!/bin/bash
# Calls 51 and 52 (issue 9, session 13): the replayed draft conditioning and the one-upload verify inputs.
# Call 51 ran it with LIMIT=580 CALL=51 before the inputs started on 16-byte boundaries (the tree attention
# refused its kvp, so its graph tests, A/B and elpis bench arm failed); call 52 after that fix.
# 1. GPU tests on the small model: draft graph tests (conditioning replay == eager bit for bit; lossless product
#    path through replays), tree graph tests (replays == eager verifies, with the one-upload inputs), tree verify;
# 2. the conditioning A/B again (call 50's was within noise: a noisy stretch hit both arms), 10 runs per arm;
# 3. `elpis bench engine`: stock chain-8 and elpis tree-16 in one run, 1K and 8K, 16 rounds after 4 warm-up.
# Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-440}
CALL=${CALL:-52}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "draft, tree graph and tree verify tests" 200 tests/exl3/test_draft_graph.py \
  tests/exl3/test_tree_graph.py tests/exl3/test_tree_verify.py
wait_synth
echo "=== conditioning A/B ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 150 python3 elpis/bench/scripts/round_sync_diag.py /tmp/full/target /tmp/full/draft \
  --conditioning-ab 10 > "$OUT/condab.txt" 2>&1
echo "conditioning A/B: exit $?" | tee -a "$OUT/log"
grep "^CONDAB" "$OUT/condab.txt" | grep '"pooled"' | tee -a "$OUT/log"
BENCH_MARGIN=15 engine_bench "round-call$CALL" 1 stock,elpis-tree16 16 4 "Stock chain-8 vs elpis tree-16 (call $CALL)"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
