#!/bin/bash
# Call 208b (session 53, a fresh machine, LIMIT ~280): the part of call 208 that fits the session's last device
# time (no full-size checkpoints): sampler_time.py (the top_k head from the largest logits beside the
# whole-vocabulary path; the device top_p path), the CUDA sampling test, and on the small model the device-round
# tests that go through the changed start, with (m), the grammar's request on the GPU until its grammar opens.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-280}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
sampler_time 40
build_and_small_synth
gpu_pytest "sampling on CUDA" 30 tests/spec/test_sampling.py
export ELPIS_SMALL_DIR=/tmp/small
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH ELPIS_PATCH_DRAFT_CANDIDATES
gpu_pytest "device rounds" $(( $(left) - 5 )) tests/exl3/test_device_round.py \
  -k "grammar or give_plain_decodings or flagged or faulted or penalised"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
