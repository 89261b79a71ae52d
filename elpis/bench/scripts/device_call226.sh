#!/bin/bash
# Call 226 (session 58; chained onto call 225's warm machine, LIMIT ~560): the 24 GiB test at 262,000 tokens with
# the served generator's rounds on the GPU (not rerun since session 56; new buffers since: the vocab draw's span
# sums, head and maxima), then the same-run bench of stock beside elpis tree-8 and tree-16 at 1K and 8K with the
# time left (nothing was measured beside stock since call 212).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
gpu_line
full_model_ready
gib24_test "device rounds, registry defaults" 300 tree-16-device-rounds
systems_bench systems-call226 15 "call 226: stock beside elpis, session 58" stock,elpis-tree8,elpis-tree16
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
