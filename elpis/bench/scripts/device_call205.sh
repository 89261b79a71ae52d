#!/bin/bash
# Call 205 (staged in session 51 for the next session; a fresh machine, LIMIT ~400): the sampler that processes a
# verify's rows together (elpis/spec/sampling.py since session 51; every step exact whatever the rows beside a
# row), never yet run on a GPU: the session's device time ran out. The row-by-row sampler before it took 14.4 ms
# for 16 rows under Qwen's recommended settings on an H100, and made a sampled round 1.56x a greedy one
# (bench/results/server, call 204). First, before anything else loads the GPU, sampler_time.py; then the CUDA
# sampling test (a row's token alone or among others, filters alike), the sampled and penalised host rounds of
# test_device_round.py on the small model, and penalty_rounds.py at 1K and 8K beside call 204's figures. Session 52
# added the served test with structured output (grammars, host rounds) on the full-size checkpoints. Run with
# run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
sampler_time
start_build_and_synths
gpu_pytest "sampling on CUDA" 60 tests/spec/test_sampling.py
join_build
export ELPIS_SMALL_DIR=/tmp/small
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH ELPIS_PATCH_DRAFT_CANDIDATES
gpu_pytest "sampled and penalised host rounds" 120 tests/exl3/test_device_round.py -k "sampled or penalised"
finish_full_synth
ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft \
  gpu_pytest "served with grammars" 160 tests/exl3/test_serve_gpu.py
penalty_rounds 1024,8192
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
