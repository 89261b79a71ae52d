#!/bin/bash
# Call 25 (prepared in session 8, for the next session): the captured graphs after the host-side refactors
# of their static inputs (elpis.exl3.upload: padded_table, static_input, fill; 193fec0) and of the plain
# module path both captures run (elpis.exl3.capture; tree verifies now also switch BC attention off, which
# their tree kernels bypass anyway), neither run on a GPU yet,
# and the served tensor-core kernel after the Hadamard-on-Q removal (SASS byte-identical to call 21's, so
# its tests run as a check of the build, not of new code). Run with run(carry=[".whl", ".device"]).
#  1. build and the full-size synthetic checkpoints (background);
#  2. tests/exl3/test_tree_graph.py and tests/exl3/test_draft_graph.py (small model): replays == eager / warm-up
#     bit for bit, lossless speculation through replays;
#  3. the tensor-core attention tests and timing line;
#  4. part treebench with the defaults.
LIMIT=${LIMIT:-575}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
gpu_pytest "graph tests (tree verify, draft block)" 240 tests/exl3/test_tree_graph.py tests/exl3/test_draft_graph.py
gpu_pytest "mma kernel tests" 100 tests/kernels/test_tree_attention_mma.py
wait_synth
TREEBENCH_MIN=110
( source elpis/bench/scripts/device_part_treebench.sh ) 2>&1 | tail -5
rm -f "$OUT/treebench.png" "$OUT/treebench.txt"
save_caches > /dev/null 2>&1
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
