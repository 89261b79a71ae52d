#!/bin/bash
# Call 21 (prepared in session 7, for the next session): the tensor-core attention after the score loop's
# warp-uniform split (call 20 measured the shared-K loop with per-k-step branches), and the Hadamard-on-Q
# experiment (ELPIS_MMA_HADAMARD_Q) beside it. Run with run(carry=[".whl", ".device"]).
#  1. build and the full-size synthetic checkpoints (background);
#  2. tensor-core attention tests: row invariance (also for the experiment), fp64 error (the experiment's
#     logged next to the default's), pipelined == direct; the timing line (mma, direct, hq, simt at 32K and
#     128K, 8 and 16 rows; call 20: mma 0.306 / 1.054 ms for 8 rows at 32K / 128K);
#  3. the phase clocks of the default build at 32K and 128K;
#  4. part treebench (call 20: tree-8 / stock = 1.028, 1.011, 0.980, 1.138 at 1K / 8K / 32K / 128K).
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
gpu_pytest "mma kernel tests" 120 tests/kernels/test_tree_attention_mma.py -k "not timing"
gpu_pytest "mma timing" 90 tests/kernels/test_tree_attention_mma.py -k timing
echo "=== phase clocks ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 90 python3 elpis/bench/scripts/mma_phase_clocks.py 32752 131056 2>&1 | grep '^{' | tee -a "$OUT/log"
wait_synth
TREEBENCH_MIN=110
( source elpis/bench/scripts/device_part_treebench.sh ) 2>&1 | tail -5
rm -f "$OUT/treebench.png" "$OUT/treebench.txt"
save_caches > /dev/null 2>&1
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
