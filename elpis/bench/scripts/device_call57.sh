#!/bin/bash
# Call 57 (issue 9, session 14): the served defaults after the gate projections kernel (exl3-gdn-ba on) and
# the greedy round's single read-back, against stock in one run.
# 1. GPU tests with the new defaults: draft graph, tree graph and tree verify tests (gdn-ba now on by default),
#    the sampling GPU test (greedy tokens on the GPU = on the CPU);
# 2. round_sync_diag: host time per phase and the synchronising calls per round (expected 3, was 4);
# 3. `elpis bench engine`: stock chain-8 and elpis tree-16 in one run at 1K, 8K, 32K and 128K, plain steps,
#    speculative rounds and TTFT (16 rounds after 4 warm-up).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set (the device copy's .git is stale).
LIMIT=${LIMIT:-580}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "draft, tree graph, tree verify and sampling tests" 200 \
  tests/exl3/test_draft_graph.py tests/exl3/test_tree_graph.py tests/exl3/test_tree_verify.py tests/spec/test_sampling.py
wait_synth
echo "=== round sync diag ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 150 python3 elpis/bench/scripts/round_sync_diag.py /tmp/full/target /tmp/full/draft \
  > "$OUT/syncdiag.txt" 2>&1
echo "sync diag: exit $?" | tee -a "$OUT/log"
grep "^SYNCDIAG" "$OUT/syncdiag.txt" | grep "tree-16" | tee -a "$OUT/log"
stem=engine-call57
echo "=== bench $stem ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 15 )) python3 -m elpis.cli bench engine \
  --model /tmp/full/target --draft /tmp/full/draft --systems stock,elpis-tree16 --checkpoints 1024,8192,32768,131072 \
  --rounds 16 --warmup 4 --time-limit $(( $(left) - 25 )) --out-dir "$OUT" --stem "$stem" \
  --title "Stock chain-8 vs elpis tree-16, served defaults of session 14 (call 57), H200" > "$OUT/$stem.txt" 2>&1
echo "bench $stem: exit $?" | tee -a "$OUT/log"
grep -E "^\| [0-9]+K" "$OUT/$stem.md" 2>/dev/null | head -12 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
