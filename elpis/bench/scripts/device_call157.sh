#!/bin/bash
# Call 157 (session 41), chained onto call 156's machine (its build and /tmp/full kept; a fresh machine makes
# both): with exl3-device-rounds and exl3-embed-gather on, as call 156 checks the GPU suite for,
# 1. device_round_ab.py at 1K and 8K, 3 timed pairs: host rounds against rounds on the GPU in one process, and
#    then the host's own time per round on the GPU's rounds (issue 9: <= 0.2 ms; `rounds_ab.host_time`);
# 2. stock chain-8 beside elpis tree-16 (rounds on the GPU) in the same `elpis bench engine` run, 1K and 8K.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_full_synth
ab device-round-ab 260 device_round_ab.py --contexts 1024,8192 --tokens 40 --pairs 3
export BENCH_MARGIN=10 ELPIS_PATCH_DEVICE_ROUNDS=1 ELPIS_PATCH_EMBED_GATHER=1
[ "$(left)" -gt 140 ] && engine_bench round-1k8k-device 1 stock,elpis-tree16 8 2 "elpis tree-16, rounds on the GPU"
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
