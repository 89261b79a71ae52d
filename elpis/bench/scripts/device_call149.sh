#!/bin/bash
# Call 149 (session 39): call 147's GPU tests and, when the rounds on the GPU pass them, a trimmed call 143 (the
# host vs device rounds A/B) in the same call, because this session's device time fits one machine start, not
# two. Order: the build and small model, the full-size synthesis in the background; the kernel tests (round plan
# and tail, zero commit plan, the rows GEMM's load-time decode check, the gate projections, the verify epilogue,
# the draft candidates with their timing lines); greedy rounds on the GPU end to end on the small model
# (tests/exl3/test_device_round.py (a)-(h)) and the draft's padded conditioning; then, only if that file passed
# and time is left, device_round_ab.py at 1K with 2 pairs of 40-token requests (medians, MADs, the noise rule and
# both arms' tokens compared). Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
start_full_synth
nvcc --version 2>&1 | tail -2 | tee -a "$OUT/log"
gpu_pytest "round plan and tail kernels, zero commit plan, load-time checks, epilogue, candidates" 170 \
  tests/kernels/test_round_plan.py tests/kernels/test_round_tail.py \
  "tests/kernels/test_gdn_tree.py::test_a_zero_plan_commits_nothing" \
  "tests/kernels/test_rows_gemm.py::test_the_served_build_passes_the_decode_check_load_backend_makes" \
  tests/kernels/test_gdn_ba.py tests/kernels/test_verify_epilogue.py tests/kernels/test_draft_candidates.py
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "greedy rounds on the GPU, small model" $(( $(left) - 200 )) \
  tests/exl3/test_device_round.py "tests/exl3/test_draft_graph.py::test_padded_conditioning_keeps_the_committed_rows_bits"
ROUNDS_RC=$LAST_PYTEST_RC
finish_full_synth
if [ "$ROUNDS_RC" = 0 ] && [ -f /tmp/full/draft/config.json ] && [ "$(left)" -gt 150 ]; then
  echo "=== device rounds A/B, 1K ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 5 $(( $(left) - 10 )) python3 elpis/bench/scripts/device_round_ab.py /tmp/full/target \
    /tmp/full/draft --out "$OUT/device-round-ab.json" --contexts 1024 --tokens 40 --pairs 2 \
    > "$OUT/device-round-ab.txt" 2>&1
  echo "device rounds A/B: exit $?" | tee -a "$OUT/log"
  grep -E "DEVROUNDAB|Error|error" "$OUT/device-round-ab.txt" | tail -6 | tee -a "$OUT/log"
else
  echo "device rounds A/B skipped: rounds rc $ROUNDS_RC, $(left) s left" | tee -a "$OUT/log"
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
