#!/bin/bash
# Call 21 (session 8): the tensor-core attention after the score loop's warp-uniform split (call 20 measured
# the shared-K loop with per-k-step branches), the Hadamard-on-Q experiment (ELPIS_MMA_HADAMARD_Q) beside it,
# and the graph-captured DFlash2 draft block (elpis.exl3.draft_graph, on by default).
# Run with run(carry=[".whl", ".device"]).
#  1. build and the full-size synthetic checkpoints (background);
#  2. tensor-core attention tests: row invariance (also for the experiment), fp64 error (the experiment's
#     logged next to the default's), pipelined == direct; the timing line (mma, direct, hq, simt at 32K and
#     128K, 8 and 16 rows; call 20: mma 0.306 / 1.054 ms for 8 rows at 32K / 128K);
#  3. draft graph tests (replay == warm-up bitwise, product path lossless through replays);
#  4. round_sync_diag at 1K: host ms per phase, draft graphs on and off in the same run;
#  5. part treebench (call 20: tree-8 / stock = 1.028, 1.011, 0.980, 1.138 at 1K / 8K / 32K / 128K), with
#     the draft graphs unless their tests failed;
#  6. the phase clocks of the default build at 32K and 128K, if time is left.
LIMIT=${LIMIT:-575}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
gpu_pytest "mma kernel tests" 100 tests/kernels/test_tree_attention_mma.py -k "not timing"
gpu_pytest "mma timing" 60 tests/kernels/test_tree_attention_mma.py -k timing
gpu_pytest "draft graph tests" 150 tests/exl3/test_draft_graph.py
draft_rc=$(grep -c "^draft graph tests: exit 0" "$OUT/log")
wait_synth
echo "=== round sync diag ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 100 python3 elpis/bench/scripts/round_sync_diag.py /tmp/full/target /tmp/full/draft 2>&1 \
  | grep '^SYNCDIAG' | sed 's/^SYNCDIAG //' | tee -a "$OUT/log" | cut -c1-400
if [ "$draft_rc" != "1" ]; then TREEBENCH_EXTRA=--draft-eager; echo "treebench: --draft-eager" | tee -a "$OUT/log"; fi
TREEBENCH_MIN=110
( source elpis/bench/scripts/device_part_treebench.sh ) 2>&1 | tail -5
rm -f "$OUT/treebench.png" "$OUT/treebench.txt"
if [ "$(left)" -gt 60 ]; then
  echo "=== phase clocks ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 5 $(( $(left) - 5 )) python3 elpis/bench/scripts/mma_phase_clocks.py 32752 131056 2>&1 | grep '^{' | tee -a "$OUT/log"
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
