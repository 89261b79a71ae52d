#!/bin/bash
# Call 201 (session 50; a fresh machine, LIMIT ~300): `elpis serve --backend exl3` end to end over HTTP on the
# small synthetic checkpoint (tests/exl3/test_serve_gpu.py): the served configuration (tree mode, rounds on the
# GPU, the run choice) against the same configuration serving one-row trees (plain decoding), greedy and sampled,
# whole and streamed. Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-300}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
export ELPIS_SMALL_DIR=/tmp/small
gpu_pytest "elpis serve --backend exl3 over HTTP" $(( $(left) - 10 )) tests/exl3/test_serve_gpu.py
grep -E "^E |Error|serve\]" "$OUT/pytest.txt" | head -20 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
