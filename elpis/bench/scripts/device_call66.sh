#!/bin/bash
# Call 66 (written in session 16 for the next session), what session 16 staged after calls 63-65.
# Ran at 30519c1 (session 17); the two-segment capture it measured was removed afterwards.
# 1. GPU tests: the snapshot against ExLlamaV3's stash (call 65's run failed it on an in-place update
#    outside inference mode, since fixed), the tree graph tests with the two-segment verify capture
#    (test_two_segment_graphs_equal_one_graph);
# 2. host_gaps at 1K and 8K: one verify graph against two segments (first 4 blocks), each under torch's
#    default CPU threads and under 1 (call 65: one 8K round in twelve stalled ~10 ms with 16 threads);
# 3. if time remains, the served bench at 1K / 8K with --host-threads 1 (compare call 65's default).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set; start with at least 700 s of budget.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "snapshot, tree graphs with segments" 200 -x \
  "tests/exl3/test_gpu.py::test_snapshot_copies_what_stash_copies" tests/exl3/test_tree_graph.py
wait_synth
for hb in 0 4; do
  echo "=== host gaps, verify head blocks $hb ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 5 120 python3 elpis/bench/scripts/host_gaps.py /tmp/full/target /tmp/full/draft --contexts 1024,8192 \
    --threads 0,1 --rounds 12 --head-blocks "$hb" 2>&1 | grep -E "^HOSTGAPS|Error|error" \
    | tee -a "$OUT/host_gaps.txt" | cut -c1-300 | tee -a "$OUT/log"
done
if [ "$(left)" -gt 150 ]; then
  b=$(( $(left) - 15 ))
  echo "=== bench, elpis-tree16 with --host-threads 1 ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 5 "$b" python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
    --systems stock,elpis-tree16 --checkpoints 1024,8192 --rounds 8 --warmup 2 --final-tokens 0 --spec-only \
    --host-threads 1 --time-limit $(( b - 10 )) --out-dir "$OUT" --stem threads1 \
    --title "elpis-tree16 with one torch CPU thread, stock beside it, H200" > "$OUT/threads1.txt" 2>&1
  sed -n '/^| context/,/^$/p' "$OUT/threads1.md" 2>/dev/null | tee -a "$OUT/log"
  rm -f "$OUT"/*.png
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
