#!/bin/bash
# Call 74 (issue 10, session 18): cold 32K prompts only, stock and elpis-tree16 (prefill groups of sixteen), so
# every TTFT is a fresh one (call 73 measured one fresh 32K TTFT per system: 4.92 / 4.13 s).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-430}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready
bench_rest cold32k "issue 10: cold 32K prompts, prefill groups of sixteen, stock vs elpis, H200" \
  --checkpoints 32768 --rounds 3 --warmup 1 --final-tokens 0
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
