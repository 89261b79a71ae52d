#!/bin/bash
# Call 67 (session 17): graphs captured at load, snapshots copied out in the background, one torch thread
# between prefills.
# 1. GPU tests: tree graphs (the lazy keys, and `test_graphs_captured_at_load_leave_nothing_to_capture`),
#    draft graphs keyed by context bucket, the snapshot against ExLlamaV3's stash (now settled from a worker
#    thread) and exact prefix reuse;
# 2. on the full-size checkpoints: what `capture_graphs` captures at load, its time and memory.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set; call 68 (the bench) follows at once.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "graphs at load, draft buckets, background snapshots" 330 -x \
  tests/exl3/test_tree_graph.py tests/exl3/test_draft_graph.py \
  "tests/exl3/test_gpu.py::test_snapshot_copies_what_stash_copies" "tests/exl3/test_gpu.py::test_prefix_reuse_is_exact"
wait_synth
echo "=== load-time captures, full size ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 15 )) python3 - <<'PY' 2>&1 | grep -E "^WARMUP|Error|error" | tee -a "$OUT/log"
import json, time, torch
from dataclasses import asdict
from elpis.exl3 import load_backend
t0 = time.perf_counter()
b = load_backend("/tmp/full/target", "/tmp/full/draft", max_context=262_144, model_id="w", tree=True)
report = asdict(b.warmup)
report.update(load_seconds=round(time.perf_counter() - t0, 1), threads=torch.get_num_threads(),
              allocated_gib=round(torch.cuda.memory_allocated() / 2**30, 3),
              peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 3))
print("WARMUP", json.dumps(report))
PY
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
