#!/bin/bash
# Call 202 (session 51; chained onto call 201's warm machine, LIMIT ~400): the GPU tests whose setup lines the
# session-50 review mend changed and that have not run since (DeviceRounds.choice now reads backend.run_choice):
# tests/exl3/test_device_round.py on the small synthetic model, and the 24 GiB test at 262,000 tokens with the run
# choice on (its JSON line reads b.run_choice) on the full-size checkpoints call 201 made. Run with
# run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-400}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
small_model_only
gpu_pytest "device rounds after the review mend" 200 tests/exl3/test_device_round.py
start_full_synth
finish_full_synth
if [ -f /tmp/full/draft/config.json ]; then
  gib24_test "run choice on (registry default), after the review mend" $(( $(left) - 15 )) tree-16-device-rounds
fi
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
