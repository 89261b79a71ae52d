#!/bin/bash
# Call 215 (session 55, a fresh machine, LIMIT ~520): the GPU suites at the session's end, the small model, the
# registry's defaults: tests/exl3 but the 24 GiB test (the rounds, trees, graphs, grammar and penalty tests with
# this session's sampler), then the GPU tests of tests/spec and tests/accept, then tests/kernels with what is left.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-520}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
small_model_only
gpu_pytest "tests/exl3 (24 GiB test left out)" 280 tests/exl3 -k "not 24gib"
gpu_pytest "tests/spec and tests/accept" 60 tests/spec tests/accept
gpu_pytest "tests/kernels" $(( $(left) - 5 )) tests/kernels
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
