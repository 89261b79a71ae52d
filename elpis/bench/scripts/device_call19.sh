#!/bin/bash
# Call 19 (session 7): prefill chunk size (issue 10). Run with run(carry=[".whl", ".device"]).
#  1. build and the full-size synthetic checkpoints;
#  2. prefill_chunk_probe.py: cold prefills of 8,229 / 32,768 / 131,072 tokens with 2048-, 4096- and
#     8192-token chunks in one process, tokens per second and whether the next verify's logits are bitwise
#     those of 2048-token chunks;
#  3. with CHUNK = 8192 in this copy of elpis/exl3/engine.py: `elpis bench engine` stock vs elpis at
#     8K / 32K / 128K (prefill and rounds, stock in the same run), then the 24 GiB test (262,000-token
#     prefill + 128 tokens under the cap, tree-16 with graphs).
# $OUT: log, pytest.txt, chunkbench.{json,md}, caches part.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
wait_synth
echo "=== chunk probe ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 200 python3 elpis/bench/scripts/prefill_chunk_probe.py /tmp/full/target /tmp/full/draft \
  --chunks 2048,4096,8192 --prompts 8229,32768,131072 2>&1 | grep -E '^\{|Error|error' | tee -a "$OUT/log"
sed -i 's/^CHUNK = 2048$/CHUNK = 8192/' elpis/exl3/engine.py && grep -n "^CHUNK" elpis/exl3/engine.py | tee -a "$OUT/log"
if [ "$(left)" -gt 230 ]; then
  echo "=== bench engine, chunk 8192 ($(left) s left)" | tee -a "$OUT/log"
  b=$(( $(left) - 130 )); [ "$b" -gt 200 ] && b=200
  timeout -k 5 "$b" python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
    --systems stock,elpis --checkpoints 8192,32768,131072 --rounds 3 --warmup 1 --final-tokens 0 --spec-only \
    --time-limit $(( b - 12 )) --out-dir "$OUT" --stem chunkbench \
    --title "issue 10: prefill with 8192-token chunks, stock vs elpis, H200" > /tmp/chunkbench.txt 2>&1
  echo "bench: exit $?" | tee -a "$OUT/log"
  sed -n '/^| system/,/^$/p' "$OUT/chunkbench.md" 2>/dev/null | tee -a "$OUT/log"
  rm -f "$OUT/chunkbench.png"
fi
if [ "$(left)" -gt 120 ]; then
  ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft gpu_pytest \
    "24 GiB, chunk 8192, tree-16 with graphs, 262K" $(( $(left) - 8 )) -s "tests/exl3/test_gpu.py::test_24gib_budget_full_model[tree-16]"
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
