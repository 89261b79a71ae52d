#!/bin/bash
# Call 126 (session 30): the 24 GiB test at HEAD on the full-size synthetic checkpoints, the server's default
# (tree-16, graphs captured at load: 262,000-token prefill and decode under a 24 GiB cap), then the chain-8
# variant if time is left. Completes call 125's whole-suite run (its 24 GiB tests skip without the checkpoints).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
wait_synth
gib24_test "tree-16 at HEAD" $(( $(left) - 20 ))
if [ "$(left)" -gt 200 ]; then
  echo "=== 24 GiB, chain-8 at HEAD ($(left) s left)" | tee -a "$OUT/log"
  ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft timeout -k 3 $(( $(left) - 10 )) \
    python3 -m pytest -m gpu "tests/exl3/test_gpu.py::test_24gib_budget_full_model[chain-8]" -q -s \
    -p no:cacheprovider -rfEs --tb=short > "$OUT/gib24_chain_pytest.txt" 2>&1
  echo "24 GiB chain-8 exit $?" | tee -a "$OUT/log"
  grep -E "\"24gib\"|passed|failed|^E " "$OUT/gib24_chain_pytest.txt" | tail -8 | tee -a "$OUT/log"
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
