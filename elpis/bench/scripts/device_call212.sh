#!/bin/bash
# Call 212 (session 55, a fresh machine, LIMIT 590): what session 55's sampler change (a top_k head sorted as
# plain tuples, top_p's reach one integer ceiling a row; the same draws) saves on the GPU machine's host:
# 1. the build and the full-size synthesis in the background; the CUDA sampling test once the build is done;
# 2. sampler_time.py (calls 208-209 timed the previous code: recommended 0.37 / 0.74 / 1.10 ms at 1 / 8 / 16
#    rows on an H100);
# 3. penalty_rounds.py at 1K: the sampled round against the greedy one in one process (call 208: 16.42 against
#    15.30 ms);
# 4. with more than 290 s left, stock beside tree-8 and tree-16 at 1K and 8K (else call 213, chained).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
join_build
gpu_pytest "sampling on CUDA" 60 tests/spec/test_sampling.py
finish_full_synth
sampler_time 60
penalty_rounds 1024
if [ "$(left)" -gt 290 ]; then
  systems_bench systems-1k8k-call212 8 "stock beside tree-8 and tree-16 (session 55)" stock,elpis-tree8,elpis-tree16
fi
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
