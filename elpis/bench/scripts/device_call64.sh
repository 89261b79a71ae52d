#!/bin/bash
# Call 64 (issue 10, written in session 15 for the next session), the served configuration (tree mode,
# layer-major prefill groups) against stock in the same run:
# 1. host_gaps.py with the prefill groups off (below);
# 2. `elpis bench engine` at 8K / 32K / 128K: TTFT and prefill tokens per second (call 61 benched chain mode).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
if [ -n "${WARM:-}" ] && [ -d build/accept ] && [ -d /tmp/full/draft ]; then
  echo "warm machine: build/accept and /tmp/full kept from the previous call" | tee -a "$OUT/log"
else
  start_build_and_full_synth
  wait_build
  wait_synth
fi
# Call 63's host_gaps found 8K rounds at 29.2 ms (bench, call 60: 20.9) with the GPU idle while the host sat in
# CPU-side copies and embedding lookups; 1K matched the bench. The 8K prompt was the first grouped prefill of
# the process (1K is one chunk). The same run with groups off says whether the prefill leaves the host slow.
echo "=== host gaps, prefill groups off ($(left) s left)" | tee -a "$OUT/log"
ELPIS_PATCH_PREFILL_GROUPS=0 timeout -k 5 130 python3 elpis/bench/scripts/host_gaps.py \
  /tmp/full/target /tmp/full/draft --contexts 1024,8192 --rounds 12 2>&1 | grep -E "^HOSTGAPS|Error|error" \
  | tee "$OUT/host_gaps_groups_off.txt" | cut -c1-420 | tee -a "$OUT/log"
echo "=== bench engine, served prefill ($(left) s left)" | tee -a "$OUT/log"
b=$(( $(left) - 15 )); [ "$b" -gt 260 ] && b=260
timeout -k 5 "$b" python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
  --systems stock,elpis-tree16 --checkpoints 8192,32768,131072 --rounds 3 --warmup 1 --final-tokens 0 --spec-only \
  --time-limit $(( b - 12 )) --out-dir "$OUT" --stem prefillbench \
  --title "issue 10: served prefill (tree mode, layer-major groups), stock vs elpis, H200" > "$OUT/prefillbench.txt" 2>&1
echo "bench: exit $?" | tee -a "$OUT/log"
sed -n '/^| system/,/^$/p' "$OUT/prefillbench.md" 2>/dev/null | tee -a "$OUT/log"
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
