#!/bin/bash
# Call 187 (staged in session 46 for the next session; a fresh machine, LIMIT ~400): the GPU tests of the Gated
# DeltaNet tree kernel after session 46's change to it (`normalise_pairs`: a norm pair past the block's rows runs
# on zeros and reads nothing, which removed a data race the PTX block check found; the live pairs' operations
# are unchanged and gave the same bits on the PTX and under emulation, but the GPU has not run it yet):
# 1. tests/kernels/test_gdn_tree.py (the kernel against its references on the GPU, rows invariant, commits);
# 2. tests/exl3/test_tree_verify.py and test_device_round.py on the small model (tree verifies and rounds on the
#    GPU through the kernel, plain decoding's tokens), with the registry's defaults;
# 3. with the full-size synthesis finished and time left, the 24 GiB test at 262,000 tokens with rounds on the GPU.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-400}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
gpu_pytest "gdn tree kernel after the race fix" 90 tests/kernels/test_gdn_tree.py
gpu_pytest "tree verify and device rounds through it" 150 tests/exl3/test_tree_verify.py \
  tests/exl3/test_device_round.py
finish_full_synth
if [ "$(left)" -gt 150 ] && [ -f /tmp/full/draft/config.json ]; then
  gib24_test "after the gdn tree race fix" $(( $(left) - 10 )) tree-16-device-rounds
fi
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
