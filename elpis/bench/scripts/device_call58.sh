#!/bin/bash
# Call 58 (issue 9, session 14): call 57's same-run bench had a noisy elpis half (tree-16 rounds of 17.7-80 ms,
# median 24.9 at 1K while its own sync diag measured 20.1 in the same call). Two more same-run runs of stock
# chain-8 and elpis tree-16, 1K and 8K, speculative rounds only, to pool per system.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-380}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
wait_synth
export BENCH_MARGIN=8
for i in 1 2; do
  engine_bench same$i 1 stock,elpis-tree16 16 4 "Stock chain-8 vs elpis tree-16 (call 58, run $i), H200"
done
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
