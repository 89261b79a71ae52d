#!/bin/bash
# Call 77 (written in session 18 as call 76; session 19 ran the verify gate's call first): the served bench after
# the embedding change (call 75).
# 1. the probe, groups of sixteen with and without the embedding ahead of the first block ("16s"), cold 32K, 3
#    repetitions: speed and bitwise logits (it also compiles Triton's kernels, so stock's first request in the
#    bench below is not a first run on a fresh machine, as in call 74);
# 2. the served bench, stock and elpis-tree16 at 8K and 32K, cumulative and fresh TTFTs (no --spec-only).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set; call 78 (profile) follows.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready
group_probe 100 --groups 16s,16 --prompts 32768 --reps 3
served_bench freshbench "issue 10: served prefill, groups of sixteen, embedding ahead of the first block, stock vs elpis, H200"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
