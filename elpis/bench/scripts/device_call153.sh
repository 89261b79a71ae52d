#!/bin/bash
# Call 153 (session 40): the round's plan in three launches. Call 151's profile put 0.64 ms of a round on the GPU
# in round_plan_kernel (one thread), most of it the Gated DeltaNet plan's per-row parts; they now run on a block
# per (row, part). Order: the build and small model, the full-size synthesis in the background; the round
# kernels' GPU tests (plan and tail against the host, the load-time checks); greedy rounds on the GPU end to end
# on the small model (tests/exl3/test_device_round.py); then, if those passed, device_round_ab.py at 1K only (a
# fresh machine leaves time for one context) with 16 profiled rounds an arm (host against device rounds:
# medians, MADs, the noise rule, tokens compared, and the kernels whose time differs).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
start_full_synth
gpu_pytest "round plan and tail kernels, load-time checks" 120 tests/kernels/test_round_plan.py \
  tests/kernels/test_round_tail.py
KERNELS_RC=$LAST_PYTEST_RC
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "greedy rounds on the GPU, small model" 170 tests/exl3/test_device_round.py
ROUNDS_RC=$LAST_PYTEST_RC
finish_full_synth
if [ "$KERNELS_RC$ROUNDS_RC" = 00 ] && [ -f /tmp/full/draft/config.json ] && [ "$(left)" -gt 120 ]; then
  echo "=== device rounds A/B with profiles ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 5 $(( $(left) - 8 )) python3 elpis/bench/scripts/device_round_ab.py /tmp/full/target \
    /tmp/full/draft --out "$OUT/device-round-ab.json" --contexts 1024 --tokens 40 --pairs 2 \
    --profile-rounds 16 > "$OUT/device-round-ab.txt" 2>&1
  echo "device rounds A/B: exit $?" | tee -a "$OUT/log"
  grep -E "DEVROUNDAB|DEVROUNDPROF|Error|error" "$OUT/device-round-ab.txt" | tail -6 | cut -c1-1500 | tee -a "$OUT/log"
else
  echo "device rounds A/B skipped: kernels rc $KERNELS_RC, rounds rc $ROUNDS_RC, $(left) s left" | tee -a "$OUT/log"
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
