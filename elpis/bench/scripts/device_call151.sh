#!/bin/bash
# Call 151 (staged in session 39 for the next session): why rounds on the GPU gained nothing in calls 149-150,
# and the draft candidates' floor pass timed.
# 1. The draft candidates kernel's GPU tests with its timing line (call 149 timed the first form at 268 us a
#    block of 7 rows against torch's 144; the floor pass is untimed), beside the verify epilogue's.
# 2. device_round_ab.py at 1K and 8K, 2 timed pairs, then one profiled request of 16 rounds per arm: GPU span,
#    busy, idle and kernels per round, and the kernels whose time differs most (device minus host).
# 3. If time is left, the same A/B with the draft candidates switch on (both arms take it).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
join_build
gpu_pytest "draft candidates and verify epilogue" 120 tests/kernels/test_draft_candidates.py \
  tests/kernels/test_verify_epilogue.py
wait_synth
for cand in 0 1; do
  [ "$(left)" -gt 120 ] || break
  echo "=== device rounds A/B with profiles, candidates switch $cand ($(left) s left)" | tee -a "$OUT/log"
  ELPIS_PATCH_DRAFT_CANDIDATES=$cand timeout -k 5 $(( $(left) - 10 )) python3 elpis/bench/scripts/device_round_ab.py \
    /tmp/full/target /tmp/full/draft --out "$OUT/device-round-prof-cand$cand.json" --contexts 1024,8192 \
    --tokens 40 --pairs 2 --profile-rounds 16 > "$OUT/device-round-prof-cand$cand.txt" 2>&1
  echo "A/B with profiles, candidates $cand: exit $?" | tee -a "$OUT/log"
  grep -E "DEVROUNDAB|DEVROUNDPROF|Error|error" "$OUT/device-round-prof-cand$cand.txt" | tail -6 | tee -a "$OUT/log"
done
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
