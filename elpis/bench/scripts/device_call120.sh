#!/bin/bash
# Call 120 (session 27), on call 119's warm machine: call 119 found the graphs' input fill still 0.31 ms with the
# embedding gather on, so the embedding was not that fill's cost. 1. upload_costs.py: the host time of each way
# of making a small stream-ordered upload; 2. the gather's GPU tests again after the fix (the draft's forward
# updates its input buffer in place, so the mask rows are now copied by the graph on every call) with the graph
# tests that failed.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-300}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
[ -d build/accept ] || { python3 -m elpis.cli build > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }; }
python3 elpis/bench/scripts/upload_costs.py 2>&1 | tail -3 | tee -a "$OUT/log"
ELPIS_PATCH_EMBED_GATHER=1 gpu_pytest "embedding gather and draft graphs (gather on)" 200 \
  tests/exl3/test_embed_gather.py tests/exl3/test_draft_graph.py
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
