#!/bin/bash
# Part "treebench" (issue 8 evidence, `elpis bench`): one `elpis bench engine` run on the full-size synthetic
# checkpoints (/tmp/full/{target,draft}) measuring ms per round of stock chain-8 (ExLlamaV3's generator),
# elpis chain-8, elpis tree-8 and elpis tree-16 (tree mode: every verify a tree of 8 or 16 rows through elpis's
# kernels; the speculation core builds trees from the DFlash2 drafter's top-k) at 1K/8K/32K/128K, speculative
# rounds only, with each system's round scratch (peak GPU allocation during the rounds over the allocation
# before the request). The report's tree table gives PASS/MISS per context for the issue's targets (tree-8
# <= stock chain-8 within noise, tree-16 <= 1.15 x tree-8, scratch < 300 MB), computed from the numbers.
# Stock runs in one worker process, the three elpis systems in a second one on one backend loaded in tree mode
# (elpis chain-8 switches it to chain mode for its turns; the first elpis system pays each prefill).
# Outputs: $OUT/treebench.{json,md,png}, the run's console output in $OUT/treebench.txt, the tree table and
# one JSON line per context in $OUT/log.
# $TREEBENCH_EXTRA, when set, is added to the bench options (e.g. --tree-eager); $TREEBENCH_MIN (default 150 s)
# is the least time left for which the part runs at all (the run reports the contexts it reached);
# $TREEBENCH_CHECKPOINTS and $TREEBENCH_ROUNDS replace the default contexts (1K/8K/32K/128K) and 8 rounds.
# Sourced after device_common.sh (PYTHONPATH, $OUT, `left`), with `python3 -m elpis.cli build` run and the
# full-size checkpoints written to /tmp/full. Budget: at most 240 s wall (the tree kernels' nvcc compiles
# included if part tree did not run before in this call).
echo "== part treebench: stock chain-8 vs elpis chain-8 vs tree-8 vs tree-16 ($(date -u +%H:%M:%S))" | tee -a "$OUT/log"
tb_budget=$(left)
if [ "$tb_budget" -gt 240 ]; then tb_budget=240; fi
if [ ! -f /tmp/full/target/config.json ] || [ ! -f /tmp/full/draft/config.json ]; then
  echo "part treebench: skipped, /tmp/full/{target,draft} missing" | tee -a "$OUT/log"
elif [ "$tb_budget" -lt "${TREEBENCH_MIN:-150}" ]; then
  echo "part treebench: skipped, only ${tb_budget}s left" | tee -a "$OUT/log"
else
  # the run stops starting measurements in time to report; the outer timeout is the last guard
  timeout -k 5 "$tb_budget" python3 -m elpis.cli bench engine \
    --model /tmp/full/target --draft /tmp/full/draft \
    --systems stock,elpis,elpis-tree8,elpis-tree16 --checkpoints ${TREEBENCH_CHECKPOINTS:-1024,8192,32768,131072} ${TREEBENCH_EXTRA:-} \
    --rounds ${TREEBENCH_ROUNDS:-8} --warmup 2 --final-tokens 0 --spec-only \
    --time-limit $(( tb_budget - 12 )) --out-dir "$OUT" --stem treebench \
    --title "issue 8: stock chain-8 vs elpis chain-8 vs tree-8 vs tree-16, H200" > "$OUT/treebench.txt" 2>&1
  echo "part treebench: exit $?" | tee -a "$OUT/log"
  if [ -f "$OUT/treebench.md" ]; then
    sed -n '/^Token trees (issue 8)/,/^Targets met/p' "$OUT/treebench.md" | tee -a "$OUT/log"
    sed -n '/^Peak GPU memory/,$p' "$OUT/treebench.md" | tee -a "$OUT/log"
    timeout 20 python3 - "$OUT/treebench.json" <<'EOF' | tee -a "$OUT/log"
import json, sys
doc = json.load(open(sys.argv[1]))
for row in doc.get("tree", []):
    out = {"part": "treebench", **{k: v for k, v in row.items() if k != "checks"}}
    out.update({f"{k}_verdict": v["verdict"] for k, v in row["checks"].items()})
    print(json.dumps(out))
for name, data in doc.get("systems", {}).items():
    print(json.dumps({"part": "treebench", "system": name, "complete": data.get("complete"),
                      "returncode": data.get("returncode"), "load_seconds": data.get("load_seconds"),
                      "errors": [e.splitlines()[0] for e in data.get("errors", [])]}))
EOF
  else
    echo "part treebench: no report written" | tee -a "$OUT/log"
  fi
  tail -25 "$OUT/treebench.txt"
fi
