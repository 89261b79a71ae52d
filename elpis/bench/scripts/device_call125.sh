#!/bin/bash
# Call 125 (session 30): the whole GPU test suite at HEAD, in one call, on the small synthetic model (the 24 GiB
# tests skip without ELPIS_FULL_TARGET; call 126 runs them on the full-size checkpoints). Earlier calls ran the
# suite in parts, each part right after the change it covered; this run checks every part against the same tree
# with the registry's defaults.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
export ELPIS_SMALL_DIR=/tmp/small
gpu_pytest "kernels, device acceptor, sampling" 240 tests/kernels tests/accept tests/spec
gpu_pytest "exl3 on the small model" $(( $(left) - 15 )) tests/exl3 --durations=15
grep -E "^[0-9.]+s (call|setup)" "$OUT/pytest.txt" | head -15 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
