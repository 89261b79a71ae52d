#!/bin/bash
# Call 131 (session 31): the split-warp tree attention in the served path, and what bounds its phase.
# 1. tree verify and its graphs on the small synthetic model (lossless speculation, row invariance, replays equal
#    to eager verifies, long context);
# 2. `elpis bench engine` at 1K and 8K, stock chain-8 and elpis tree-16 in the same run (no regression where the
#    attention is a small part of the round);
# 3. diagnostics, never served (the checkout's copy on this machine is edited, nothing comes back): phase clocks
#    at 262K with the V staging removed (the score warps alone), then with the scores and P removed (the V
#    staging alone).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "tree verify and graphs, small model" 200 tests/exl3/test_tree_verify.py \
  tests/exl3/test_tree_graph.py
wait_synth
export BENCH_MARGIN=100
engine_bench round-1k8k 1 stock,elpis-tree16 12 3 "elpis tree-16 with the split-warp tree attention (call 131), H200"
K=patches/kernels/tree_attention_mma.cu
cp $K /tmp/served.cu
sed -i 's/^            stage_v_groups<kVBits>(b, ahead.v);$/            \/\/ diagnostic: no V staging/' $K
grep -c "diagnostic: no V staging" $K | tee -a "$OUT/log"
echo "=== phase clocks without the V staging ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 60 python3 elpis/bench/scripts/mma_phase_clocks.py 262128 2>&1 | grep -v Warning | tee -a "$OUT/log"
cp /tmp/served.cu $K
sed -i 's/^            score_softmax_rows(b, warp, n, active, t0, scale);$/            \/\/ diagnostic: no scores/' $K
grep -c "diagnostic: no scores" $K | tee -a "$OUT/log"
echo "=== phase clocks without the scores and P ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 60 python3 elpis/bench/scripts/mma_phase_clocks.py 262128 2>&1 | grep -v Warning | tee -a "$OUT/log"
cp /tmp/served.cu $K
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
