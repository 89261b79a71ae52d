#!/bin/bash
# Call 200 (session 50; a fresh machine, LIMIT ~570): the run choice (exl3-run-choice, elpis/spec/run_choice.py)
# on the GPU. On the small synthetic model: rounds on the GPU that change their verify's row count every round, and
# the served choice over the graphs' load-time times, and sampled host rounds at alternating row counts
# (tests/exl3/test_device_round.py (i)-(k), with the file's other tests); session 49's 8-row tree attention build's GPU test in its final form. Then, on the full-size
# synthetic model, the 24 GiB test at 262,000 tokens with rounds on the GPU and the run choice switched on: both
# row counts' graphs captured at load; its JSON line names the rounds at each row count and every (rows, bucket)
# round time the warm-up measured. Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-570}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
join_build
export ELPIS_SMALL_DIR=/tmp/small
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH ELPIS_PATCH_DRAFT_CANDIDATES
gpu_pytest "device rounds with row counts changing, the run choice" 240 tests/exl3/test_device_round.py
gpu_pytest "the 8-row attention build's bits" 60 \
  "tests/kernels/test_tree_attention_mma.py::test_eight_row_build_keeps_the_16_row_builds_bits"
finish_full_synth
if [ -f /tmp/full/draft/config.json ]; then
  ELPIS_PATCH_RUN_CHOICE=1 gib24_test "run choice on, both row counts captured" $(( $(left) - 15 )) \
    tree-16-device-rounds
fi
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
