#!/bin/bash
# Call 16 (prepared in session 6, for the next session): the tensor-core attention after its staged-row
# table (the kernel went from ~47,500 to ~5,400 SASS instructions, and now fits the instruction cache) and
# after row dealing was limited to one wave.
# Before it, on the CPU machine: `bash elpis/bench/scripts/prepare_device_carry.sh` (the extension, ~30 min),
# then run(carry=[".whl", ".device"]) with ELPIS_GIT_REVISION set.
#  1. build and the full-size synthetic checkpoints (background);
#  2. tensor-core attention tests (row invariance, fp64 error, pipelined == direct staging) and, once the
#     synthesis is done, the timing line (call 15: 0.524 / 1.241 ms for 8 rows at 32K / 128K);
#  3. part treebench (call 15: tree-8 / stock = 1.07, 0.98, 1.03, 1.17 at 1K / 8K / 32K / 128K);
#  4. the tree graph tests (replays and graph commits against eager, losslessness), if time is left;
#  5. the 24 GiB test in tree mode with graphs (262,000-token prefill + 128 tokens, 16-row verifies), if
#     time is left; its peak and graph replays go to the log.
# $OUT returns at most 8 files: log, pytest.txt, treebench.{json,md,txt}, caches.tar.xz.part-*.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
python3 -c "import exllamav3.ext as e; print('exllamav3 ext', e.exllamav3_ext.__file__)" 2>&1 | tail -1 | tee -a "$OUT/log"
start_build_and_full_synth
wait_build
gpu_pytest "mma kernel tests" 100 tests/kernels/test_tree_attention_mma.py -k "not timing"
wait_synth
gpu_pytest "mma timing" 60 tests/kernels/test_tree_attention_mma.py -k timing
TREEBENCH_MIN=110
( source elpis/bench/scripts/device_part_treebench.sh ) 2>&1 | tail -5
rm -f "$OUT/treebench.png"  # $OUT returns at most 8 files
save_caches > /dev/null 2>&1
if [ "$(left)" -gt 200 ]; then
  ELPIS_SMALL_DIR=/tmp/full gpu_pytest "tree graph tests, full size" 190 tests/exl3/test_tree_graph.py
fi
if [ "$(left)" -gt 150 ]; then
  ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft gpu_pytest \
    "24 GiB, tree-16 with graphs, 262K" $(( $(left) - 10 )) -s "tests/exl3/test_gpu.py::test_24gib_budget_full_model[tree-16]"
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
