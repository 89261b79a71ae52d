#!/bin/bash
# Call 159 (staged in session 41 for the next session): with rounds on the GPU served by default, the host's own
# time per round is 2.3 ms at 1K (call 157), about ten launches and copies a round from Python. The draft's
# candidates are one of them: torch's composition (cast, log_softmax, gather, topk, cat) where the
# exl3-draft-candidates kernel makes four launches (15 us against torch's 141 on the GPU, call 151). Its round
# A/B was within noise with host rounds (call 151, 0.06 ms); what it saves on the host with rounds on the GPU is
# what this measures: switch_ab.py, off against on, 1K and 8K, 3 pairs, each arm's host time per round
# (`rounds_ab.device_host_time`), then a device-round profile at 1K for where the GPU's idle time goes now.
# First, the two span kernels' GPU tests: since session 41 their host code takes the spans from the proved
# schedule (build/kernels/row_spans.h; their device PTX is unchanged, so this is a check, not a new kernel).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
join_build
gpu_pytest "span kernels (spans from the proved schedule)" 120 tests/kernels/test_verify_epilogue.py \
  tests/kernels/test_draft_candidates.py
wait_synth
ab switch-ab-candidates-call159 200 switch_ab.py --switches exl3-draft-candidates --contexts 1024,8192 --pairs 3
ab device-round-prof-call159 10 device_round_ab.py --contexts 1024 --pairs 2 --profile-rounds 16
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
