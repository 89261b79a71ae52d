#!/bin/bash
# Call 65 (session 16): what calls 63-64 found, acted on.
# 1. Snapshots through one pinned staging buffer (`CachePageStore.save_state`; call 64 timed ExLlamaV3's
#    stash at ~120 ms per snapshot, 0.14 s of a 1.04 s 8K prefill): the GPU tests that a snapshot holds what
#    stash holds and restores it, that prefix reuse (GPU tier and disk across a restart) stays exact, and the
#    grouped prefill's exactness test (it compares snapshots' states).
# 2. The host after a grouped prefill: call 63 measured 8K tree-16 rounds at 29.2 ms with groups on, call 64
#    21.3 ms with them off, the GPU idle while the host sat in CPU copies and embedding lookups. host_gaps at
#    8K with groups on, under torch's default CPU threads and under one thread, traces (with Python stacks)
#    kept.
# 3. The served prefill bench, stock and elpis-tree16 at 8K and 32K (TTFT, begin()'s time and its parts).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-500}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "snapshots, prefix reuse, grouped prefill" 150 \
  "tests/exl3/test_gpu.py::test_snapshot_copies_what_stash_copies" "tests/exl3/test_gpu.py::test_prefix_reuse_is_exact" \
  tests/exl3/test_prefill_groups.py "tests/exl3/test_gpu.py::test_restart_reuses_disk_prefix"
wait_synth
echo "=== host gaps at 8K, groups on, threads default and 1 ($(left) s left)" | tee -a "$OUT/log"
mkdir -p "$OUT/traces"
timeout -k 5 100 python3 elpis/bench/scripts/host_gaps.py /tmp/full/target /tmp/full/draft --contexts 8192 \
  --threads 0,1 --rounds 12 --trace-dir "$OUT/traces" 2>&1 | grep -E "^HOSTGAPS|Error|error" \
  | tee "$OUT/host_gaps.txt" | cut -c1-700 | tee -a "$OUT/log"
echo "=== bench engine, served prefill ($(left) s left)" | tee -a "$OUT/log"
b=$(( $(left) - 12 ))
timeout -k 5 "$b" python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
  --systems stock,elpis-tree16 --checkpoints 8192,32768 --rounds 3 --warmup 1 --final-tokens 0 --spec-only \
  --time-limit $(( b - 10 )) --out-dir "$OUT" --stem prefillbench \
  --title "issue 10: served prefill (tree mode, layer-major groups, pinned snapshots), stock vs elpis, H200" \
  > "$OUT/prefillbench.txt" 2>&1
echo "bench: exit $?" | tee -a "$OUT/log"
python3 - "$OUT/prefillbench.json" <<'PY' 2>&1 | tee -a "$OUT/log"
import json, sys
d = json.load(open(sys.argv[1]))
for name, s in d["systems"].items():
    for cp in s.get("checkpoints", []):
        sp = cp["spec"]
        print(name, cp["context"], "ttft", sp.get("ttft_seconds"), "begin", sp.get("prefill_seconds"),
              sp.get("prefill_parts"), "cached", sp.get("cached"), "rounds ms",
              [round(x * 1e3, 1) for x in sp.get("round_seconds", [])])
PY
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
