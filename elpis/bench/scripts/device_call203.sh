#!/bin/bash
# Call 203 (session 51; a fresh machine or chained, LIMIT ~480): penalties and logit_bias on the GPU. On the small
# synthetic model, tests/exl3/test_device_round.py (l): a penalised request keeps host rounds, and with the known
# continuation drafted it commits plain penalised decoding's tokens, greedy and sampled. Then, on the full-size
# checkpoints, tests/exl3/test_serve_gpu.py with two more requests (Qwen's recommended settings with
# presence_penalty 1.5; greedy with every penalty and a bias) against --tree-budget 1. Run with
# run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-480}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
gpu_pytest "penalised requests on the exl3 backend" 150 tests/exl3/test_device_round.py -k penalised
finish_full_synth
export ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft
gpu_pytest "elpis serve --backend exl3 over HTTP, penalties included" $(( $(left) - 10 )) tests/exl3/test_serve_gpu.py
grep -E "^E |Error" "$OUT/pytest.txt" | head -20 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
