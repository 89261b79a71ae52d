#!/bin/bash
# Call 156 (staged in session 40 for the next session): the whole GPU test suite with rounds on the GPU and the
# embedding gather switched on (exl3-device-rounds needs the gather), as call 125 ran it with the registry's
# defaults. Session 40 measured rounds on the GPU faster than host rounds beyond noise (calls 153-154, H100:
# -0.61 ms at 1K and 8K, tokens identical) and the 24 GiB test at 262,000 tokens passing with them (call 155);
# what is owed before both defaults flip is every GPU test with them on: load-time captures of the rounds'
# graphs, the page-locked embedding table, the served generator's paths. The 24 GiB tests skip here (they need
# ELPIS_FULL_TARGET); call 155 ran the rounds' one. If all pass: flip exl3-device-rounds and exl3-embed-gather to
# on in patches/registry.json, with this call's file as evidence.
# The full-size synthetic checkpoints are made in the background meanwhile, for call 157 chained onto this machine.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
start_full_synth
export ELPIS_SMALL_DIR=/tmp/small ELPIS_PATCH_DEVICE_ROUNDS=1 ELPIS_PATCH_EMBED_GATHER=1
gpu_pytest "kernels, device acceptor, sampling (rounds on the GPU on)" 240 tests/kernels tests/accept tests/spec
gpu_pytest "exl3 on the small model (rounds on the GPU on)" $(( $(left) - 15 )) tests/exl3 --durations=15
grep -E "^[0-9.]+s (call|setup)" "$OUT/pytest.txt" | head -15 | tee -a "$OUT/log"
finish_full_synth
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
