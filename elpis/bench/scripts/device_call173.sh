#!/bin/bash
# Call 173 (staged in session 44 for the next session; a fresh machine). Call 172 found a second fault in the
# bench: tree-8's keys, captured beside tree-16's on one load, evicted tree-16's (the tree graphs keep 20), so
# tree-16's first round on the GPU found no captured verify. Now each tree system has a worker process and a
# load of its own row count (`cli.worker_groups`, b55d7aa). This call:
# 1. `elpis bench engine` of stock, elpis chain-8, tree-8 and tree-16 at 1K and 8K (three worker processes):
#    passes when every system completes; gives issue 9's 16-row against 8-row round in one run, each on a load
#    of its own row count;
# 2. the host time and profile at 1K and 8K on one load under composed rounds (call 164: 0.23 ms a round at
#    8K against 0.12 at 1K, from two runs);
# 3. with the time left, the second A/B of `exl3-draft-candidates` at 1K (call 164: gain 0.16, noise 0.12).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_full_synth
unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH
systems_bench systems-1k8k-call173 130 \
  "stock beside elpis chain-8, tree-8 and tree-16, each tree on a load of its row count, rounds and plain"
echo "=== host profile at 1024 and 8192 on one load ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 110 python3 elpis/bench/scripts/device_round_host_profile.py /tmp/full/target /tmp/full/draft \
  --context 1024 8192 --tokens 60 --top 45 --round-graph on > "$OUT/hostprof-1k8k-call173.txt" 2>&1
echo "host profile 1024, 8192: exit $?" | tee -a "$OUT/log"
grep -E "HOSTTIME|HOSTPROF|function calls" "$OUT/hostprof-1k8k-call173.txt" | tee -a "$OUT/log"
ab switch-ab-candidates-call173 10 switch_ab.py --switches exl3-draft-candidates --contexts 1024 --pairs 3
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
