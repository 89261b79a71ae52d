#!/bin/bash
# Part "treeattn" (issue 8, items 2 and 6): the tree-verify attention kernel (patches/kernels/tree_attention.cu,
# with the proved split schedule build/kernels/verify_schedule.h from `elpis build`) on the GPU:
# bitwise row invariance (renumbered rows, rewritten siblings, the path in another tree, every row against a
# 1-row call at ctx+depth) around split boundaries, at 1K and 32K, 1..16 rows; max error against float64 and
# against the CPU float32 emulation of its algorithm; refusals of bad inputs; then one timing JSON line per
# (ctx 1K/32K, rows 8/16) with flash_attn's paged kvcache call beside it when flash_attn imports.
# Sourced after device_common.sh (PYTHONPATH, $OUT, `left`), with `python3 -m elpis.cli build` already run.
# nvcc builds for the current GPU only (sm_90 on the H200). Budget: at most 45 s wall.
echo "== part treeattn: tree-verify attention ($(date -u +%H:%M:%S))" | tee -a "$OUT/log"
ta_budget=$(left)
if [ "$ta_budget" -gt 45 ]; then ta_budget=45; fi
if [ "$ta_budget" -lt 12 ]; then
  echo "part treeattn: skipped, only ${ta_budget}s left" | tee -a "$OUT/log"
elif [ ! -f build/kernels/verify_schedule.h ]; then
  echo "part treeattn: skipped, build/kernels/verify_schedule.h missing (elpis build failed?)" | tee -a "$OUT/log"
else
  ta_t0=$(date +%s)
  # correctness first, leaving ~12 s for the timing line (the kernel library is cached by then)
  ELPIS_KERNEL_LOG="$OUT/log" timeout -k 3 $(( ta_budget - 12 )) python3 -m pytest -m gpu \
    tests/kernels/test_tree_attention.py -k "not timing" -q -p no:cacheprovider -rs --durations=5 2>&1 \
    | tail -25 | tee -a "$OUT/log"
  echo "part treeattn: correctness exit ${PIPESTATUS[0]}" | tee -a "$OUT/log"
  ta_rest=$(( ta_budget - ($(date +%s) - ta_t0) ))
  if [ "$ta_rest" -ge 6 ]; then
    ELPIS_KERNEL_LOG="$OUT/log" timeout -k 2 "$ta_rest" python3 -m pytest -m gpu \
      tests/kernels/test_tree_attention.py -k timing -q -p no:cacheprovider -rs 2>&1 | tail -4 | tee -a "$OUT/log"
    echo "part treeattn: timing exit ${PIPESTATUS[0]}" | tee -a "$OUT/log"
  else
    echo "part treeattn: timing skipped, only ${ta_rest}s left" | tee -a "$OUT/log"
  fi
fi
