#!/bin/bash
# Call 205 (staged in session 51 for the next session; a fresh machine, LIMIT ~200): the sampler's cost and the
# rows-on-streams variant. Session 51 measured the served sampler at 14.4 ms for 16 rows under Qwen's
# recommended settings (H100; the rows one after another, ~0.9 ms each) and a sampled round at 1.56x a greedy
# one (bench/results/server). Commit a1a32fa holds a variant of elpis/spec/sampling.py whose `_drive` puts each
# row on a CUDA stream of its own (same kernels, so the same bits by construction); it was never run on a GPU
# (the session's device time ran out) and main keeps the served sampler. To measure it: check that file out
# (`git show a1a32fa:elpis/spec/sampling.py > elpis/spec/sampling.py`) and run this script, which times
# sample_rows (sampler_time.py) before anything else loads the GPU, runs the CUDA sampling test (a row's token
# alone or among others, filters alike) and, as far as the limit reaches, the sampled and penalised host rounds
# of test_device_round.py on the small model. Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-200}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
gpu_line
timeout -k 3 60 python3 elpis/bench/scripts/sampler_time.py 2>&1 | tail -3 | tee -a "$OUT/log"
start_build
gpu_pytest "sampling on CUDA" 60 tests/spec/test_sampling.py
timeout -k 2 40 python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1 | tee -a "$OUT/log"
join_build
export ELPIS_SMALL_DIR=/tmp/small
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH ELPIS_PATCH_DRAFT_CANDIDATES
gpu_pytest "sampled and penalised host rounds" $(( $(left) - 5 )) tests/exl3/test_device_round.py -k "sampled or penalised"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
