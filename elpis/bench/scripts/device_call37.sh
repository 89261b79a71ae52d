#!/bin/bash
# Calls 37-41 (issue 9): `elpis bench engine` on the full-size synthetic checkpoints with the patch exl3-rows-gemm.
# Run A (ELPIS_PATCH_ROWS_GEMM=1: the elpis backend loads with rows_gemm=True): stock chain-8 (ExLlamaV3's
# generator, its own GEMMs, in its own worker) beside elpis tree-8 and tree-16 at 1K and 8K. Run B
# (ELPIS_PATCH_ROWS_GEMM=0): elpis tree-8 and tree-16 with ExLlamaV3's GEMMs at the same contexts, the A/B of the
# patch on the same machine. Speculative rounds only (random weights: the draft never matches). Calls 37-41 ran
# this with the kernel's grid at 3, 6 and finally 2 blocks per multiprocessor (bench/results/rows_gemm/).
# Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
[ -f build/kernels/gemm_schedule.h ] || { echo "no gemm_schedule.h after the build" | tee -a "$OUT/log"; exit 1; }
wait_synth
bench() {  # label patch systems
  echo "=== bench $1 ($(left) s left)" | tee -a "$OUT/log"
  ELPIS_PATCH_ROWS_GEMM=$2 timeout -k 5 $(( $(left) - 20 )) python3 -m elpis.cli bench engine \
    --model /tmp/full/target --draft /tmp/full/draft --systems "$3" --checkpoints 1024,8192 \
    --rounds 8 --warmup 2 --final-tokens 0 --spec-only --time-limit $(( $(left) - 30 )) --out-dir "$OUT" \
    --stem "rowsgemm-$1" --title "issue 9: elpis's 1-16-row EXL3 GEMM ($1), H200" > "$OUT/rowsgemm-$1.txt" 2>&1
  echo "bench $1: exit $?" | tee -a "$OUT/log"
  grep -E "ms/round|round|tree-8|tree-16|stock" "$OUT/rowsgemm-$1.md" 2>/dev/null | head -20 | tee -a "$OUT/log"
}
bench kernel 1 stock,elpis-tree8,elpis-tree16
bench exllamav3-gemm 0 elpis-tree8,elpis-tree16
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
