#!/bin/bash
# Call 52 (issue 9, session 13): call 51 again after its fix (the one-upload verify inputs now start each
# input on a 16-byte boundary, as the tree attention requires; call 51 failed its graph tests on that).
# 1. GPU tests on the small model: draft graph tests (conditioning replay == eager bit for bit; lossless product
#    path through replays), tree graph tests (replays == eager verifies, with the one-upload inputs), tree verify;
# 2. the conditioning A/B again (call 50's was within noise: a noisy stretch hit both arms), 10 runs per arm;
# 3. `elpis bench engine`: stock chain-8 and elpis tree-16 in one run, 1K and 8K, 16 rounds after 4 warm-up.
# Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-440}
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
BENCH_MARGIN=15 engine_bench round-call52 1 stock,elpis-tree16 16 4 "Stock chain-8 vs elpis tree-16 (call 52)"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
