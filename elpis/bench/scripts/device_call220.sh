#!/bin/bash
# Call 220 (session 56; a fresh machine, LIMIT ~470): with the registry's defaults (exl3-sample-draw and
# exl3-round-adjust on since calls 218-219), every device-round GPU test on the small model (a)-(o), test (l)
# turning adjusting off for its host rounds, and the sample draw's kernel test.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set to this machine's revision.
LIMIT=${LIMIT:-470}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
small_model_only
gpu_pytest "device rounds, defaults" $(( $(left) - 15 )) tests/exl3/test_device_round.py tests/kernels/test_sample_draw.py
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
