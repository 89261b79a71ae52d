#!/bin/bash
# Call 31 (prepared in session 9, for the next session): the registry patch exl3-tree-verify on the GPU
# (apply_all now lists it and runs its enable(); the wrappers still install on the first tree verify) and
# the op-gate GPU tests after MODEL_ONLY_PATCHES (the bar is checked for the patches with op candidates).
# Run with run(carry=[".whl", ".device"]).
#  1. build;
#  2. the engine's tree tests and test_gpu.py on the small model (tree mode through apply_all's patch);
#  3. part gate (the op gate on the small model, its GPU tests).
# (The switch turned off is CPU-tested: tests/exl3/test_tree_plan.py, tests/server/test_tree_flag.py.)
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
( time ELPIS_PROVE_JOBS=14 python3 -m elpis.cli build ) >/tmp/build.log 2>&1
tail -3 /tmp/build.log | tee -a "$OUT/log"
gpu_pytest "tree engine tests (small model)" 200 tests/exl3/test_tree_verify.py tests/exl3/test_tree_graph.py
gpu_pytest "engine tests (small), defaults" 200 tests/exl3/test_gpu.py -k "not 24gib"
part gate
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
