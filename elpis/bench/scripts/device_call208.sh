#!/bin/bash
# Call 208 (session 53; a fresh machine, LIMIT ~480): session 52's staged calls 206 and 207 in one, and session
# 53's rounds on the GPU for a grammar's request until its grammar opens (`elpis.spec.generate`; the device rounds
# now start from a given context, so they can start again after rounds that ended at an opening token).
#  - sampler_time.py first (the device top_p path of session 52, never timed on a GPU, and session 53's top_k head
#    read from the largest logits beside the whole-vocabulary path it replaces), then the CUDA sampling test
#    beside the build;
#  - the whole of tests/exl3/test_device_round.py on the small model (every device-round test goes through the
#    changed start; (m) is the new grammar test);
#  - penalty_rounds.py --grammar at 1K: what a grammar costs a round, and a greedy request under a grammar that
#    stays closed (as tool_choice auto's until `<tool_call>`) beside plain greedy;
#  - with the time left (~100 s needed), the served exl3 test with a required tool call.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-440}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
sampler_time 40
start_build_and_synths
gpu_pytest "sampling on CUDA" 40 tests/spec/test_sampling.py
join_build
export ELPIS_SMALL_DIR=/tmp/small
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH ELPIS_PATCH_DRAFT_CANDIDATES
gpu_pytest "device rounds" 190 tests/exl3/test_device_round.py
finish_full_synth
penalty_rounds 1024 --grammar --pairs 2
if [ "$(left)" -gt 100 ]; then
  ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft \
    gpu_pytest "served with grammars and a tool call" $(( $(left) - 5 )) tests/exl3/test_serve_gpu.py
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
