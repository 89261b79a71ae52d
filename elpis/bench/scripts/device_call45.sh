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
start_build_and_synths
wait_build
[ -f build/kernels/gemm_schedule.h ] || { echo "no gemm_schedule.h after the build" | tee -a "$OUT/log"; exit 1; }
timeout -k 3 90 python3 -m elpis.cli dequantize --model /tmp/small/target --out /tmp/small-deq > /tmp/deq.log 2>&1
tail -1 /tmp/deq.log | tee -a "$OUT/log"
rows_gemm_model_gate rows-gemm-grouped-code-small
wait_synth
title="issue 9: elpis's 1-16-row EXL3 GEMM, grouped"
engine_bench rowsgemm-kernel 1 stock,elpis-tree8,elpis-tree16 16 8 "$title (kernel), H200"
engine_bench rowsgemm-exllamav3-gemm 0 elpis-tree8,elpis-tree16 16 8 "$title (exllamav3-gemm), H200"
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
