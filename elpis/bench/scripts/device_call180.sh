#!/bin/bash
# Call 180 (staged in session 45 for the next session; a fresh machine). `exl3-draft-candidates` went on by
# default in session 45, and calls 174-179 ran most GPU test files with it; this call runs the rest with the
# registry's defaults:
# 1. tests/exl3 on the small model (the whole directory, test_round_graph.py included) while the full-size
#    synthesis runs;
# 2. the 24 GiB test at 262,000 tokens with rounds on the GPU (the memory requirement with the candidates
#    kernel's launches in the captured draft graphs);
# 3. with more than 290 s left, stock beside tree-8 and tree-16 (call 175's bench, on a fresh machine under
#    `cli.group_budget`, whose reserve call 175's warm machine did not test).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
gpu_pytest "exl3 on the small model, registry defaults (draft candidates on)" 200 tests/exl3 --durations=5
finish_full_synth
gib24_test "registry defaults (draft candidates on)" 140 tree-16-device-rounds
if [ "$(left)" -gt 290 ]; then
  systems_bench systems-1k8k-call180 8 "stock beside tree-8 and tree-16, fresh machine, group budgets" \
    stock,elpis-tree8,elpis-tree16
fi
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
