#!/bin/bash
# Call 221 (staged in session 56, whose device time ran out, for the next one; a fresh machine, LIMIT ~240):
# tests (n) and (o) again after they came to share speculative() and with_known_continuation() (the same
# calls), with the registry's defaults.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set to this machine's revision.
LIMIT=${LIMIT:-240}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
small_model_only
gpu_pytest "(n) and (o), defaults" $(( $(left) - 10 )) tests/exl3/test_device_round.py \
  -k "sampled_requests_draw or penalised_requests_adjust"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
