#!/bin/bash
# Call 72 (issue 10, session 18): prefill groups of eight with the prefix cache's snapshots taken inside a
# group, layer by layer.
# 1. GPU tests: grouped prefill (groups of 4 and 8, prefix cache on) bitwise equal to chunk by chunk, its
#    snapshots included; prefix reuse; the snapshot against ExLlamaV3's stash;
# 2. the probe, one process: groups of 4, 8 and 16 alternating, 3 repetitions, cold 8K and 32K (speed, peak);
# 3. the disk tier across a restart (its first prompt's 8192 snapshot now taken inside a group).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set; call 73 (24 GiB, served bench) follows.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "prefill groups with inner snapshots, prefix reuse, snapshot" 200 -s \
  tests/exl3/test_prefill_groups.py "tests/exl3/test_gpu.py::test_prefix_reuse_is_exact" \
  "tests/exl3/test_gpu.py::test_snapshot_copies_what_stash_copies"
grep -h "prefill groups of" "$OUT/pytest.txt" | tee -a "$OUT/log"
wait_synth
echo "=== group probe ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 150 python3 elpis/bench/scripts/prefill_group_probe.py /tmp/full/target /tmp/full/draft \
  --groups 4,8,16 --prompts 8229,32768 --reps 3 2>&1 | grep -E '^\{|Error|error' | tee "$OUT/probe.jsonl" | tee -a "$OUT/log"
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "disk tier across a restart" $(( $(left) - 8 )) --durations=3 \
  "tests/exl3/test_gpu.py::test_restart_reuses_disk_prefix"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
