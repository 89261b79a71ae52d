#!/bin/bash
# Call 116 (staged in session 25 for the next session; its device time was spent): the Gated DeltaNet tree kernel
# as served since call 115 (bit for bit call 114's and d63cb6e's on gdn_vs_previous's trees, but not yet through
# the GPU tests itself), in the model:
# 1. GPU tests: the kernel's own (fp64 error, row invariance, commit = one token at a time) and the tree verify and
#    graph tests (lossless product path, graph replays bitwise equal to eager verifies);
# 2. a same-run round bench, stock chain-8 and elpis tree-16 at 1K and 8K (the first with the final kernel);
# 3. a fresh per-phase profile, if time is left (call 103's was before the rescheduling).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
gpu_pytest "gdn tree kernel, tree verify and graphs" 200 tests/kernels/test_gdn_tree.py tests/exl3/test_tree_verify.py \
  tests/exl3/test_tree_graph.py
wait_synth
engine_bench round-call116 1 stock,elpis-tree16 12 3 "GDN tree kernel as served since call 115"
[ "$(left)" -gt 200 ] && tree_profile 10
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
