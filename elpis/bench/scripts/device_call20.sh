#!/bin/bash
# Call 20 (session 7): the tensor-core attention with tiles below ctx skipping the slot tables and their barrier
# and sharing each K fragment between a warp's two rows (emulated: bitwise the previous kernel's output).
# Run with run(carry=[".whl", ".device"]).
#  1. build and the full-size synthetic checkpoints (background);
#  2. tensor-core attention tests (row invariance, fp64 error, pipelined == direct staging) and the timing
#     line (call 18: 0.359 / 1.102 ms for 8 rows at 32K / 128K, same kind of machine);
#  3. part treebench, if time is left (call 18: tree-8 / stock = 0.999, 1.068, 0.979, 1.138);
#  4. the phase clocks, if time is left.
LIMIT=${LIMIT:-380}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
gpu_pytest "mma kernel tests" 100 tests/kernels/test_tree_attention_mma.py -k "not timing"
gpu_pytest "mma timing" 60 tests/kernels/test_tree_attention_mma.py -k timing
wait_synth
TREEBENCH_MIN=110
( source elpis/bench/scripts/device_part_treebench.sh ) 2>&1 | tail -5
rm -f "$OUT/treebench.png" "$OUT/treebench.txt"
if [ "$(left)" -gt 70 ]; then
  echo "=== phase clocks ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 5 $(( $(left) - 5 )) python3 elpis/bench/scripts/mma_phase_clocks.py 32752 131056 2>&1 | grep '^{' | tee -a "$OUT/log"
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
