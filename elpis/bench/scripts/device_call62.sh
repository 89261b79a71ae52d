#!/bin/bash
# Call 62 (issue 10, session 15): call 61's GPU test of prefill groups again, now comparing only the cache
# positions a prefill writes (call 61 failed it on the last page's unwritten slots, which hold an earlier
# sequence's verify rows when the page is handed out again; the probe's logits were bitwise equal).
LIMIT=${LIMIT:-300}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
export ELPIS_PATCH_PREFILL_GROUPS=1
build_and_small_synth
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "prefill groups" 150 -s tests/exl3/test_prefill_groups.py
grep -h "prefill groups:" "$OUT/pytest.txt" | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
