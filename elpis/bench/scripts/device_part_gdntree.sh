#!/bin/bash
# Part "gdntree" (issue 8, item 3): the Gated DeltaNet tree kernel (patches/kernels/gdn_tree.cu) on the GPU at
# the real head geometry (48 value heads x 128 x 128 fp32 state, conv 10240 x 4): max error against float64
# and against the float32 emulation of its algorithm (1..16 rows); bitwise row invariance (renumbered rows,
# rewritten siblings, the path inside another tree, every row against a 1-row call at the state after its
# first d path tokens); commit bitwise equal to committing one token at a time; refusals of bad inputs; then
# one timing JSON line (median us per call, verify at 8 and 16 rows and commit of a path, one layer).
# Sourced after device_common.sh (PYTHONPATH, $OUT, `left`), with `python3 -m elpis.cli build` already run
# (the tests take tree masks from the acceptor). nvcc builds for the current GPU only (sm_90 on the H200).
# Budget: at most 30 s wall including the compile.
echo "== part gdntree: Gated DeltaNet over a tree ($(date -u +%H:%M:%S))" | tee -a "$OUT/log"
gt_budget=$(left)
if [ "$gt_budget" -gt 30 ]; then gt_budget=30; fi
if [ "$gt_budget" -lt 12 ]; then
  echo "part gdntree: skipped, only ${gt_budget}s left" | tee -a "$OUT/log"
else
  gt_t0=$(date +%s)
  # correctness first (includes the nvcc compile), leaving ~8 s for the timing line
  ELPIS_KERNEL_LOG="$OUT/log" timeout -k 2 $(( gt_budget - 8 )) python3 -m pytest -m gpu \
    tests/kernels/test_gdn_tree.py -k "not timing" -q -p no:cacheprovider -rs --durations=5 2>&1 \
    | tail -25 | tee -a "$OUT/log"
  echo "part gdntree: correctness exit ${PIPESTATUS[0]}" | tee -a "$OUT/log"
  gt_rest=$(( gt_budget - ($(date +%s) - gt_t0) ))
  if [ "$gt_rest" -ge 5 ]; then
    ELPIS_KERNEL_LOG="$OUT/log" timeout -k 1 "$gt_rest" python3 -m pytest -m gpu \
      tests/kernels/test_gdn_tree.py -k timing -q -p no:cacheprovider -rs 2>&1 | tail -4 | tee -a "$OUT/log"
    echo "part gdntree: timing exit ${PIPESTATUS[0]}" | tee -a "$OUT/log"
  else
    echo "part gdntree: timing skipped, only ${gt_rest}s left" | tee -a "$OUT/log"
  fi
fi
