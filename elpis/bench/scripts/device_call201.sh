#!/bin/bash
# Call 201 (session 50; staged again for the next session; a fresh machine, LIMIT ~420): `elpis serve --backend
# exl3` end to end over HTTP (tests/exl3/test_serve_gpu.py): the served configuration (tree mode, rounds on the
# GPU, the run choice) against the same configuration serving one-row trees (plain decoding), greedy and sampled,
# whole and streamed, on the full-size synthetic checkpoints (their real Qwen vocabulary; the small model's 32K
# one refused the chat template's tokens with 400 in the first run of this call, at 1151629). Run with
# run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-420}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_full_synth
export ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft
gpu_pytest "elpis serve --backend exl3 over HTTP" $(( $(left) - 10 )) tests/exl3/test_serve_gpu.py
grep -E "^E |Error" "$OUT/pytest.txt" | head -20 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
