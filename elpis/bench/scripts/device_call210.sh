#!/bin/bash
# Call 210 (session 54, a fresh machine, LIMIT ~180): test (m) on the small model, the grammar's request on the
# GPU until its grammar opens. Call 209 ran its grammar over the small model's own rows at last, and then the
# generator refused the request: the small model's stop ids (Qwen's) lie past its 32,768 rows and a grammar
# refuses ignore_eos, so the test now stands the last row in for the end of sequence.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-400}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
small_model_only
# As staged, one pytest of "grammar or give_plain_decodings" on a fresh machine printed nothing in its 98 s
# (call 210); chained on the warm machine (call 211) the grammar test alone passed in 45 s, the other three in 16.
gpu_pytest "grammar on the GPU" 150 tests/exl3/test_device_round.py -k grammar
gpu_pytest "device rounds plain" $(( $(left) - 5 )) tests/exl3/test_device_round.py -k give_plain_decodings
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
