#!/bin/bash
# Call 44 (issue 9, session 12): the 24 GiB test at 262,000 tokens (tree-16 with graphs) with the patch
# exl3-rows-gemm on, on the machine call 43 left warm (its build and /tmp/full are reused; a fresh machine makes
# them first). Run with run(carry=[".whl", ".device"]).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
if [ ! -f /tmp/full/draft/config.json ] || [ ! -f build/kernels/gemm_schedule.h ]; then
  start_build_and_full_synth
  wait_build
  wait_synth
fi
echo "=== 24 GiB, tree-16 with graphs, rows GEMM on, 262K ($(left) s left)" | tee -a "$OUT/log"
ELPIS_PATCH_ROWS_GEMM=1 ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft \
  timeout -k 3 $(( $(left) - 10 )) python3 -m pytest -m gpu \
  "tests/exl3/test_gpu.py::test_24gib_budget_full_model[tree-16]" -q -s -p no:cacheprovider -rfEs --tb=short \
  > "$OUT/gib24_pytest.txt" 2>&1
echo "24 GiB tree-16 exit $?" | tee -a "$OUT/log"
grep -E "\"24gib\"|passed|failed|^E " "$OUT/gib24_pytest.txt" | tail -8 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
