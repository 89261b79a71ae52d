#!/bin/bash
# Call 75 (issue 10, session 18, the session's last ~290 s of device time): the embedding gathered chunk by
# chunk ahead of the first block and staged in pinned memory (prefill_groups.OVERLAP_EMBEDDING), against the
# order before it ("16s"), in one process: cold 32K prompts in groups of sixteen, alternating, verify logits
# compared bitwise with the first variant's.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-270}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
wait_synth
echo "=== embedding overlap probe ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 $(( $(left) - 5 )) python3 elpis/bench/scripts/prefill_group_probe.py /tmp/full/target /tmp/full/draft \
  --groups 16s,16 --prompts 32768 --reps 3 2>&1 | grep -E '^\{|Error|error' | tee "$OUT/probe.jsonl" | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
