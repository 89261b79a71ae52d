#!/bin/bash
# Call 222 (session 57; a fresh machine, LIMIT ~560): sampled requests without top_k drawn on the GPU over their
# whole vocabulary, their rounds there (registry patch exl3-vocab-draw, off until this call), and whether to turn
# it on:
# 1. the build and the full-size synthesis in the background; on the small model with ELPIS_PATCH_VOCAB_DRAW=1,
#    the kernels' GPU tests (tests/kernels/test_vocab_draw.py, and test_sample_draw.py after its steps moved into
#    sample_draw_steps.cuh) and the device-round tests (p) (without top_k), (n) (top_k) and (o) (penalised);
# 2. the served test (full size) with ELPIS_PATCH_VOCAB_DRAW=1: its "sampled" request (temperature alone) then
#    runs on the GPU, against `--tree-budget 1` on the same requests;
# 3. penalty_rounds.py --gpu-vocab at 1K and 8K: temperature alone, and with top_p 0.8, on host rounds and on the
#    GPU's, arms alternating in one process, tokens checked equal ("gpu_vocab_saves_ms").
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
ELPIS_PATCH_VOCAB_DRAW=1 gpu_pytest "vocab draw kernels and rounds without top_k" 200 -s \
  tests/kernels/test_vocab_draw.py tests/kernels/test_sample_draw.py tests/exl3/test_device_round.py \
  -k "vocab or sample_draw or sample_rows or without_top_k or sampled_requests_draw or penalised_requests_adjust"
grep -E "^\(p\)" "$OUT/pytest.txt" | tee -a "$OUT/log"
finish_full_synth
ELPIS_PATCH_VOCAB_DRAW=1 ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft \
  gpu_pytest "served, vocab draw on" 150 tests/exl3/test_serve_gpu.py
penalty_rounds 1024,8192 --gpu-vocab
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
