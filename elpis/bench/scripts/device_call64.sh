#!/bin/bash
# Call 64 (issue 10, written in session 15 for the next session), the served configuration (tree mode,
# layer-major prefill groups) against stock in the same run:
# 1. `elpis bench profile` of the last prefill chunks before 32K, with kernel names per phase (the 2026-11-30
#    profile had families only; "other: copy" was 8.8 µs per token for elpis and 15.5 for stock, unexplained);
# 2. `elpis bench engine` at 8K / 32K / 128K: TTFT and prefill tokens per second (call 61 benched chain mode).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
wait_synth
echo "=== prefill profile at 32K ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 220 python3 -m elpis.cli bench profile --systems stock,elpis-tree16 \
  --model /tmp/full/target --draft /tmp/full/draft --out-dir "$OUT" --time-limit 200 \
  --checkpoints 32768 --profile-prefill 32768 --stem prefill-profile 2>&1 | grep -v "it/s\]$" | tail -12 | tee -a "$OUT/log"
grep -h "prefill 32K" "$OUT/prefill-profile.md" | cut -c1-1500 | tee -a "$OUT/log"
rm -f "$OUT"/*.png
echo "=== bench engine, served prefill ($(left) s left)" | tee -a "$OUT/log"
b=$(( $(left) - 15 )); [ "$b" -gt 230 ] && b=230
timeout -k 5 "$b" python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
  --systems stock,elpis-tree16 --checkpoints 8192,32768,131072 --rounds 3 --warmup 1 --final-tokens 0 --spec-only \
  --time-limit $(( b - 12 )) --out-dir "$OUT" --stem prefillbench \
  --title "issue 10: served prefill (tree mode, layer-major groups), stock vs elpis, H200" > "$OUT/prefillbench.txt" 2>&1
echo "bench: exit $?" | tee -a "$OUT/log"
sed -n '/^| system/,/^$/p' "$OUT/prefillbench.md" 2>/dev/null | tee -a "$OUT/log"
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
