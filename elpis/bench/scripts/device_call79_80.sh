#!/bin/bash
# Calls 79 and 80 (session 19), run as two inline commands on the machine call 78 left warm; kept as the record
# of what ran. 79: five cold 32K prefills in one process, the served prefill configuration (groups of sixteen,
# the embedding ahead of the first block). 80: a cold 262,000-token prompt, stock and elpis-tree16 in one run.
# Run with run(carry=[".whl", ".device"]); PART=79 or PART=80 (default: both).
LIMIT=${LIMIT:-420}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready
if [ "${PART:-79}" = 79 ] || [ -z "${PART:-}" ]; then
  group_probe 200 --groups 16s --prompts 32768 --reps 5
fi
if [ "${PART:-80}" = 80 ] || [ -z "${PART:-}" ]; then
  bench_rest bench262k "issue 10: cold 262K prompt, groups of sixteen, stock vs elpis" --checkpoints 262000 \
    --rounds 2 --warmup 1 --final-tokens 0 --spec-only
fi
