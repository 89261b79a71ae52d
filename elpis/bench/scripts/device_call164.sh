#!/bin/bash
# Call 164 (session 43), chained onto call 163's warm machine (its build and /tmp/full kept): issue 9's numbers
# with rounds on the GPU as composed graphs, side by side with stock ExLlamaV3 in the same run (call 161's
# stock worker hit its deadline; the last same-run stock rows are call 157's): `elpis bench engine`, stock and
# elpis tree-16, at 1K and 8K, speculative rounds and plain decode. Then the pieces-vs-graph A/B at 8K with the
# host's time a round (call 160: 1.73 ms there, call 161's cProfile about 0.4; the staged uploads' waits now
# apart), and the draft-candidates kernel's switch A/B at 1K under round graphs.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
gpu_line
start_build
start_full_synth
join_build
wait_synth
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH
stem=round-plain-1k8k-call164
echo "=== bench $stem ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 300 python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
  --systems stock,elpis-tree16 --checkpoints 1024,8192 --rounds 12 --warmup 3 --final-tokens 0 --time-limit 285 \
  --out-dir "$OUT" --stem "$stem" --title "stock beside elpis tree-16 (composed round graphs), rounds and plain" \
  > "$OUT/$stem.txt" 2>&1
echo "bench $stem: exit $?" | tee -a "$OUT/log"
grep -E "^\| (stock|elpis)|^\| [0-9]+K" "$OUT/$stem.md" 2>/dev/null | head -12 | tee -a "$OUT/log"
ab round-graph-ab-call164 90 round_graph_ab.py --contexts 8192 --pairs 3
ab switch-ab-candidates-call164 10 switch_ab.py --switches exl3-draft-candidates --contexts 1024 --pairs 3
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
