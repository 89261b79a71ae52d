#!/bin/bash
# Call 74 (issue 10, session 18): cold 32K prompts only, stock and elpis-tree16 (prefill groups of sixteen), so
# every TTFT is a fresh one (call 73 measured one fresh 32K TTFT per system: 4.92 / 4.13 s).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-430}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
if [ ! -f /tmp/full/draft/config.json ]; then  # a fresh machine: build and synthesise first
  start_build_and_full_synth
  wait_build
  wait_synth
fi
echo "=== bench engine, cold 32K ($(left) s left)" | tee -a "$OUT/log"
b=$(( $(left) - 12 ))
timeout -k 5 "$b" python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
  --systems stock,elpis-tree16 --checkpoints 32768 --rounds 3 --warmup 1 --final-tokens 0 \
  --time-limit $(( b - 10 )) --out-dir "$OUT" --stem cold32k \
  --title "issue 10: cold 32K prompts, prefill groups of sixteen, stock vs elpis, H200" > "$OUT/cold32k.txt" 2>&1
echo "bench: exit $?" | tee -a "$OUT/log"
grep -E "^\| (stock|elpis)|^- (stock|elpis)" "$OUT/cold32k.md" | tee -a "$OUT/log"
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
