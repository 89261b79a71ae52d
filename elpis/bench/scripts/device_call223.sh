#!/bin/bash
# Call 223 (session 57; a fresh machine, LIMIT ~560), after call 222 and three changes: round_tail.cu ignores an
# undecided drawn target (-5) off the committed path; the generator backs off after undrawn rounds in a row
# (generate._Backoff); the head's rounds have a switch of their own (exl3-vocab-draw-heads, off):
# 1. with ELPIS_PATCH_VOCAB_DRAW=1 on the small model: the kernels' GPU tests (the vocab draw's whole, its row
#    count now allowing the coarse rows' ties at 248,320 columns; the sample draw's; the round tail's, whose
#    load-time check now holds undecided targets on and off the path) and tests/exl3/test_device_round.py whole
#    ((p) turns the heads on itself);
# 2. penalty_rounds.py --gpu-vocab at 1K: the top_p arm (heads on, every round undrawn on a random model's
#    flat rows) with the backoff, against call 222's 50.8 ms.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
ELPIS_PATCH_VOCAB_DRAW=1 gpu_pytest "kernels and device rounds, vocab draw on" 260 tests/kernels/test_vocab_draw.py \
  tests/kernels/test_sample_draw.py tests/kernels/test_round_tail.py tests/exl3/test_device_round.py
finish_full_synth
penalty_rounds 1024 --gpu-vocab
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
