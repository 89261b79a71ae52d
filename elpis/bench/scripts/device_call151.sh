#!/bin/bash
# Call 151 (session 40): the draft candidates' span kernels timed, why rounds on the GPU gained nothing in calls
# 149-150, and in-process A/Bs of switches that keep every bit.
# 1. The draft candidates kernels' GPU tests with their timing line (call 149 timed the one-block-a-row form at
#    268 us a block of 7 rows against torch's 144; session 40 cut each row into 31 spans), beside the verify
#    epilogue's.
# 2. switch_ab.py, exl3-draft-candidates off against on (two backends in one process), 1K, 3 pairs: the round.
# 3. device_round_ab.py at 1K, 2 timed pairs and one profiled request of 16 rounds per arm: GPU span, busy, idle
#    and kernels per round of host and device rounds, and the kernels whose time differs most.
# 4. switch_ab.py with the four same-bits switches that were each within noise alone (exl3-gdn-qkv-channel-major,
#    exl3-norm-input, exl3-mlp-act-input, exl3-embed-gather), 1K and 8K, 3 pairs, 16 profiled rounds an arm.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
join_build
gpu_pytest "draft candidates and verify epilogue" 120 tests/kernels/test_draft_candidates.py \
  tests/kernels/test_verify_epilogue.py
candidates_ok=$LAST_PYTEST_RC
wait_synth
if [ "$candidates_ok" = 0 ]; then
  ab switch-ab-candidates-call151 250 switch_ab.py --switches exl3-draft-candidates --contexts 1024 --pairs 3
fi
ab device-round-prof-call151 170 device_round_ab.py --contexts 1024 --pairs 2 --profile-rounds 16
ab switch-ab-same-bits-call151 10 switch_ab.py --contexts 1024,8192 --pairs 3 --profile-rounds 16 \
  --switches exl3-gdn-qkv-channel-major,exl3-norm-input,exl3-mlp-act-input,exl3-embed-gather
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
