#!/bin/bash
# Part "tree" (issue 8 items 2-5): token-tree verify inside the exl3 engine (Exl3Backend(tree=True),
# elpis/exl3/tree_verify.py) on the small synthetic checkpoint:
#   1. a smoke round with shapes and timings printed (load in tree mode, a 4-row tree verify, a path commit,
#      plain steps), then ms per round of stock chain-8 vs tree mode at 8 and 16 rows (1.5K context), every
#      exception with its full traceback;
#   2. tests/exl3/test_tree_verify.py: refusals of bad trees/paths; a tree row's logits bit-identical to plain
#      decoding of its path (any row index, siblings, shape, size); tree-mode speculative decoding (replayed
#      continuation inside random trees of 1/2/4/8/12/16 rows, and always-wrong trees) equal to tree-mode
#      plain decoding; the speculation core with the DFlash2 drafter's top-k trees (8 and 16 rows) equal to
#      plain decoding; chain mode still lossless with the patches installed and tree vs stock chain reported;
#   3. tests/exl3/test_gpu.py::test_matches_stock_generator in the same process (patches installed): the
#      chain path still equals ExLlamaV3's own generator.
# JSON lines go to $OUT/log (ELPIS_TREE_LOG); the whole pytest output to $OUT/tree_pytest.txt.
# Sourced after device_common.sh (PYTHONPATH, $OUT, `left`), with `python3 -m elpis.cli build` and
# `python3 -m elpis.cli synth --small /tmp/small` already run (ELPIS_SMALL_DIR=/tmp/small).
# Budget: at most 150 s wall including the nvcc compiles of the two kernels.
echo "== part tree: tree verify in the engine ($(date -u +%H:%M:%S))" | tee -a "$OUT/log"
tr_budget=$(left)
if [ "$tr_budget" -gt 150 ]; then tr_budget=150; fi
if [ "$tr_budget" -lt 45 ]; then
  echo "part tree: skipped, only ${tr_budget}s left" | tee -a "$OUT/log"
else
  tr_t0=$(date +%s)
  export ELPIS_SMALL_DIR=${ELPIS_SMALL_DIR:-/tmp/small}
  export ELPIS_TREE_LOG="$OUT/log"
  timeout -k 3 45 python3 - <<'EOF' 2>&1 | tail -40 | tee -a "$OUT/log"
import os, time, traceback
from pathlib import Path
t0 = time.perf_counter()
try:
    import torch
    from elpis.exl3 import load_backend
    from elpis.bench.workload import prompt
    small = Path(os.environ["ELPIS_SMALL_DIR"])
    b = load_backend(small / "target", small / "draft", max_context=65536, model_id="smoke",
                     host_cache_gib=0.5, tree=True, prefix_cache=False)
    print(f"smoke: loaded in tree mode in {time.perf_counter() - t0:.1f}s, fixed_rows={b.fixed_rows}")
    ids = prompt(700, 1, b.info.vocab_size)
    b.begin(ids)
    try:
        t = time.perf_counter()
        logits = b.verify([ids[-1], 5, 6, 7], [-1, 0, 0, 1])
        torch.cuda.synchronize()
        call = b.pending.tree
        print(f"smoke: 4-row tree verify {1000 * (time.perf_counter() - t):.1f} ms, logits {tuple(logits.shape)} "
              f"{logits.dtype}, finite {bool(logits.isfinite().all())}, gdn layers {sorted(call.gdn)}, "
              f"attention layers {call.attention_layers}, positions {call.layout.position_ids(call.kvp)[:5]}")
        rec = next(iter(call.gdn.values()))
        print("smoke: gdn record shapes", {k: (tuple(v.shape), str(v.dtype)) for k, v in vars(rec).items()})
        t = time.perf_counter()
        b.commit([0, 1, 3])
        torch.cuda.synchronize()
        print(f"smoke: commit of path [0, 1, 3] {1000 * (time.perf_counter() - t):.1f} ms, position {b.position()}")
        for _ in range(3):
            t = time.perf_counter()
            logits = b.verify([int(logits[-1].argmax())], [-1])
            torch.cuda.synchronize()
            b.commit([0])
            print(f"smoke: plain step {1000 * (time.perf_counter() - t):.1f} ms")
    finally:
        b.finish()
    print("smoke: ok")
    # ms per round (verify + commit of the anchor row) on the small model at a 1.5K context: chain-8 (stock
    # kernels, fixed 8 rows) against tree mode with 8- and 16-row trees (always 16 rows run)
    def rounds(label, rows, parents, n=12):
        b.begin(ids)
        try:
            anchor, times = ids[-1], []
            for i in range(n):
                t = time.perf_counter()
                out = b.verify([anchor] + rows[1:], parents)
                anchor = int(out[0].argmax())
                b.commit([0])
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            times = sorted(times[2:])
            print(f"timing: {label}: median {1000 * times[len(times) // 2]:.2f} ms per round")
        finally:
            b.finish()
    ids = prompt(1500, 2, b.info.vocab_size)
    chain8 = list(range(-1, 7))
    tree16 = [-1, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    rounds("tree-8 (chain-shaped)", [0] * 8, chain8)
    rounds("tree-16", [0] * 16, tree16)
    b.tree, b.fixed_rows = False, 8
    rounds("stock chain-8", [0] * 8, chain8)
except Exception:
    traceback.print_exc()
    print("smoke: FAILED")
EOF
  tr_rest=$(( tr_budget - ($(date +%s) - tr_t0) - 3 ))
  if [ "$tr_rest" -lt 30 ]; then
    echo "part tree: tests skipped, only ${tr_rest}s left" | tee -a "$OUT/log"
  else
    timeout -k 3 "$tr_rest" python3 -m pytest -m gpu tests/exl3/test_tree_verify.py \
      tests/exl3/test_gpu.py::test_matches_stock_generator -q -p no:cacheprovider -rfEs --tb=long \
      --durations=8 > "$OUT/tree_pytest.txt" 2>&1
    echo "part tree: pytest exit $?" | tee -a "$OUT/log"
    grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed|error" "$OUT/tree_pytest.txt" | tail -12 | tee -a "$OUT/log"
    tail -60 "$OUT/tree_pytest.txt"
  fi
fi
