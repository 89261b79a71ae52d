#!/bin/bash
# Call 64 (issue 10, written in session 15 for the next session): `elpis bench engine` stock vs elpis-tree16
# (the served configuration: tree mode, layer-major prefill groups) at 8K / 32K / 128K, for TTFT and prefill
# tokens per second with stock in the same run (call 61 benched chain-mode elpis).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-400}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
wait_synth
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
