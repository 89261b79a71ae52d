#!/bin/bash
# Call 209 (session 54, a fresh machine, LIMIT ~240): what call 208 left open. sampler_time.py again with 30
# calls an arm and torch.topk alone (call 208 had the top_k head from the largest logits slower than the
# whole-vocabulary path at 16 rows only), the CUDA sampling test (zero-weight tokens now out of a top_k head),
# then on the small model test (m), the grammar's request on the GPU until its grammar opens, its grammar now
# over the small model's own rows (call 208: llguidance refused the whole Qwen tokenizer for 32,768 rows).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-240}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
sampler_time 60
build_and_small_synth
gpu_pytest "sampling on CUDA" 30 tests/spec/test_sampling.py
export ELPIS_SMALL_DIR=/tmp/small
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH ELPIS_PATCH_DRAFT_CANDIDATES
gpu_pytest "device rounds" $(( $(left) - 5 )) tests/exl3/test_device_round.py -k "grammar or give_plain_decodings"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
