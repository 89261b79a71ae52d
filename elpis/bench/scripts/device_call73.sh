#!/bin/bash
# Call 73 (issue 10, session 18; right after call 72 on the warm machine): with prefill groups of sixteen (call 72: 8,051 tok/s cold at 32K, peak 22.34 GiB),
# 1. the 24 GiB test at 262,000 tokens (tree-16, graphs captured at load): the peak under the cap;
# 2. the served bench, stock and elpis-tree16 at 8K and 32K, cumulative and fresh TTFTs (no --spec-only).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready
gib24_test "tree-16, graphs captured at load, prefill groups of 16, 262K" 200
served_bench freshbench "issue 10: served prefill, groups of sixteen, cumulative and fresh TTFT, stock vs elpis, H200"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
