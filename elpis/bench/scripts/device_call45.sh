#!/bin/bash
# Call 45 (issue 9, session 12), two parts on one machine:
# 1. the model gate of the grouped rows GEMM again, now that a configuration naming rows-gemm carries
#    code=<digest of its kernel sources> (call 42 measured the same build under the spec of session 10's build,
#    which the ledger counts as measured before the rule exl3-small-rows-gemm-r2). Same arms and corpus as call 42.
# 2. the round A/B of call 43 again with 16 rounds after 8 warm-up rounds (call 43's 2 warm-up rounds left three
#    tree-16 graph captures inside the timed rounds at 1K; written in bench/results/rows_gemm/README.md before
#    this run: this A/B decides the default's condition 3).
# As run in session 12 the gate line lacked ELPIS_PATCH_ROWS_GEMM=1 (the rows-gemm arm was refused: the registry
# patch was off); call 46 ran that part alone on the same warm machine, as now written here.
# Run with run(carry=[".whl", ".device"]). Afterwards, on the CPU machine: copy $OUT/gate/model-*.{json,npz} and
# the ledger lines to bench/results/gate/, then elpis gate verdict.
LIMIT=${LIMIT:-580}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
timeout -k 2 60 python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1 | tee -a "$OUT/log"
wait_build
[ -f build/kernels/gemm_schedule.h ] || { echo "no gemm_schedule.h after the build" | tee -a "$OUT/log"; exit 1; }
timeout -k 3 90 python3 -m elpis.cli dequantize --model /tmp/small/target --out /tmp/small-deq > /tmp/deq.log 2>&1
tail -1 /tmp/deq.log | tee -a "$OUT/log"
CODE=$(python3 -c "from elpis.exl3.gate import code_digest; print(code_digest(['rows-gemm']))")
echo "rows-gemm code=$CODE" | tee -a "$OUT/log"
mkdir -p "$OUT/gate"
ref="device=cuda:0,model=/tmp/small-deq,path=prefill"
echo "=== gate model ($(left) s left)" | tee -a "$OUT/log"
ELPIS_PATCH_ROWS_GEMM=1 timeout -k 3 150 python3 -m elpis.cli gate model --model /tmp/small/target --random-ids 32768 \
  --label rows-gemm-grouped-code-small --results "$OUT/gate" --wikitext-chunks 8 --wikitext-tokens 512 --gsm8k 0 \
  --aime 0 --greedy-prompts 0 --reference "reference:dtype=fp64,$ref" \
  --arm "floor-tree=exl3:patches=gdn-state-fp32+tree-verify,rows=8" \
  --arm "floor-stock=exl3:patches=none,rows=8" \
  --arm "rows-gemm=exl3:code=$CODE,patches=gdn-state-fp32+rows-gemm+tree-verify,rows=8" \
  2>&1 | grep -v "^\s*$" | tail -16 | tee -a "$OUT/log"
wait_synth
bench() {  # label patch systems
  echo "=== bench $1 ($(left) s left)" | tee -a "$OUT/log"
  ELPIS_PATCH_ROWS_GEMM=$2 timeout -k 5 $(( $(left) - 20 )) python3 -m elpis.cli bench engine \
    --model /tmp/full/target --draft /tmp/full/draft --systems "$3" --checkpoints 1024,8192 \
    --rounds 16 --warmup 8 --final-tokens 0 --spec-only --time-limit $(( $(left) - 30 )) --out-dir "$OUT" \
    --stem "rowsgemm-$1" --title "issue 9: elpis's 1-16-row EXL3 GEMM, grouped ($1), H200" \
    > "$OUT/rowsgemm-$1.txt" 2>&1
  echo "bench $1: exit $?" | tee -a "$OUT/log"
  grep -E "^\| [0-9]+K" "$OUT/rowsgemm-$1.md" 2>/dev/null | head -8 | tee -a "$OUT/log"
}
bench kernel 1 stock,elpis-tree8,elpis-tree16
bench exllamav3-gemm 0 elpis-tree8,elpis-tree16
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
