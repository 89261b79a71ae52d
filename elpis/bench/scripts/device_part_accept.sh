#!/bin/bash
# Part "accept" (issue 9, item 2): the proven acceptor compiled from the same generated C as CUDA device
# code, table-checked on the GPU. Sourced after device_common.sh (PYTHONPATH, $OUT, `left`), with
# `python3 -m elpis.cli build` already run. Runs the GPU tests of tests/accept/test_device_acceptor.py:
# the whole reference table on the GPU (timed: a JSON line with decisions/s), a mutated copy of the
# generated C failing that check, random batches equal to the CPU acceptor's, side streams and a CUDA
# graph. nvcc builds for the current GPU only (sm_90 on the H200). Budget: at most 45 s wall.
echo "== part accept: device acceptor ($(date -u +%H:%M:%S))" | tee -a "$OUT/log"
budget=$(left)
if [ "$budget" -gt 45 ]; then budget=45; fi
if [ "$budget" -lt 10 ]; then
  echo "part accept: skipped, only ${budget}s left" | tee -a "$OUT/log"
else
  ELPIS_DEVICE_LOG="$OUT/log" timeout -k 5 "$budget" python3 -m pytest -m gpu tests/accept/test_device_acceptor.py \
    -q -p no:cacheprovider -p no:warnings -rfEs --durations=6 2>&1 | tail -22 | tee -a "$OUT/log"
  echo "part accept: exit ${PIPESTATUS[0]}" | tee -a "$OUT/log"
fi
