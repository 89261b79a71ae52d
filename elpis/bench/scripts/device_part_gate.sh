#!/bin/bash
# Part "gate" (issue 7): the ExLlamaV3 ops of the served path against fp64 on the small synthetic model
# (`elpis gate op --backend exl3`, stock ExLlamaV3 and every elpis numerics patch as a candidate in one
# process, default grid), run by the GPU test that checks the measurement, then the other GPU tests of
# tests/exl3/test_gate_provider.py. Sourced after device_common.sh (PYTHONPATH, $OUT, `left`). The
# measurement lands in $OUT/gate/ for bench/results/gate/; $OUT/log gets the pytest summaries, any op or
# candidate left out, and one JSON line per op and implementation (worst cell) and per candidate's bar.
# Budget: at most 45 s wall.
echo "== part gate: exl3 ops against fp64 ($(date -u +%H:%M:%S))" | tee -a "$OUT/log"
gate_t0=$(date +%s)
gate_budget=$(left)
if [ "$gate_budget" -gt 45 ]; then gate_budget=45; fi
gate_left() { echo $(( gate_budget - ($(date +%s) - gate_t0) )); }
mkdir -p "$OUT/gate"
if [ ! -d /tmp/small ] && [ "$(gate_left)" -gt 25 ]; then
  timeout -k 2 15 python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1 | tee -a "$OUT/log"
fi
gate_json="$OUT/gate/op-exl3-small-seed0-h200.json"
if [ ! -d /tmp/small ] || [ "$(gate_left)" -lt 12 ]; then
  echo "part gate: skipped, $(gate_left)s left or no /tmp/small" | tee -a "$OUT/log"
else
  # the measurement first (default grid, written to $gate_json), then the refusal and configuration tests
  for gate_tests in "on_the_small_model" "wider_than or teacher_forces"; do
    gate_rest=$(gate_left)
    if [ "$gate_rest" -lt 6 ]; then
      echo "part gate: GPU tests '$gate_tests' skipped, only ${gate_rest}s left" | tee -a "$OUT/log"
      continue
    fi
    ELPIS_SMALL_DIR=/tmp/small ELPIS_GATE_OP_OUT="$gate_json" timeout -k 3 "$gate_rest" \
      python3 -m pytest -m gpu tests/exl3/test_gate_provider.py -k "$gate_tests" -q -p no:cacheprovider -rs \
      --durations=3 > "$OUT/gate/pytest.txt" 2>&1
    echo "part gate: pytest '$gate_tests' exit $?" | tee -a "$OUT/log"
    grep -E "left out|passed|failed|error|Error|skipped|s call" "$OUT/gate/pytest.txt" | tail -12 | tee -a "$OUT/log"
    mv "$OUT/gate/pytest.txt" "$OUT/gate/pytest-${gate_tests%% *}.txt"
  done
  if [ -f "$gate_json" ]; then
    python3 - "$gate_json" <<'EOF' | tee -a "$OUT/log"
import json, sys
record = json.load(open(sys.argv[1]))
worst = {}
for cell in record["cells"]:
    for impl, s in cell["impls"].items():
        w = worst.setdefault((cell["op"], impl), {"cells": 0, "mean": 0.0, "p99": 0.0, "max": 0.0})
        w["cells"] += 1
        for k in ("mean", "p99", "max"):
            w[k] = max(w[k], s[k])
for (op, impl), w in worst.items():
    print(json.dumps({"gate_op": op, "impl": impl, **w}))
for name, bar in record["bar"].items():
    print(json.dumps({"gate_bar": name, "pass": bar["pass"], "cells": bar["cells"], "worse": len(bar["worse"])}))
EOF
  else
    echo "part gate: no measurement written" | tee -a "$OUT/log"
  fi
fi
