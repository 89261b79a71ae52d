#!/bin/bash
# Call 61 (issue 10, session 15): layer-major prefill groups (patch exl3-prefill-groups), switched on here.
# 1. GPU tests: grouped prefill bitwise equal to chunk by chunk (pages, recurrent state, verify logits) and
#    the prefix-reuse tests of test_gpu.py (their backend prefills in groups, with snapshots);
# 2. the probe, one process: groups of 1 and 4 alternating, 3 repetitions, cold 8K and 32K prompts;
# 3. `elpis bench engine` stock vs elpis at 8K / 32K / 128K (TTFT, prefill tok/s, stock in the same run);
# 4. the 24 GiB test at 262,000 tokens with groups on (its peak).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
export ELPIS_PATCH_PREFILL_GROUPS=1
start_build_and_synths
wait_build
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "prefill groups and prefix reuse" 150 -s \
  tests/exl3/test_prefill_groups.py "tests/exl3/test_gpu.py::test_prefix_reuse_is_exact"
grep -h "prefill groups:" "$OUT/pytest.txt" | tee -a "$OUT/log"
wait_synth
echo "=== group probe ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 130 python3 elpis/bench/scripts/prefill_group_probe.py /tmp/full/target /tmp/full/draft \
  --groups 1,4 --prompts 8229,32768 --reps 3 2>&1 | grep -E '^\{|Error|error' | tee "$OUT/probe.jsonl" | tee -a "$OUT/log"
if [ "$(left)" -gt 300 ]; then
  echo "=== bench engine, prefill groups ($(left) s left)" | tee -a "$OUT/log"
  b=$(( $(left) - 125 )); [ "$b" -gt 210 ] && b=210
  timeout -k 5 "$b" python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
    --systems stock,elpis --checkpoints 8192,32768,131072 --rounds 3 --warmup 1 --final-tokens 0 --spec-only \
    --time-limit $(( b - 12 )) --out-dir "$OUT" --stem groupbench \
    --title "issue 10: prefill in layer-major groups of four 2048-token chunks, stock vs elpis, H200" \
    > "$OUT/groupbench.txt" 2>&1
  echo "bench: exit $?" | tee -a "$OUT/log"
  sed -n '/^| system/,/^$/p' "$OUT/groupbench.md" 2>/dev/null | tee -a "$OUT/log"
  rm -f "$OUT/groupbench.png"
fi
[ "$(left)" -gt 115 ] && gib24_test "tree-16 with graphs, prefill groups of 4, 262K"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
