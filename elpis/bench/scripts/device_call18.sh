#!/bin/bash
# Call 18 (session 7): the combine loads its split partials eight at a time (same folding order, so the same
# bits), and where tree-8's round loses to stock at 1K. Run with run(carry=[".whl", ".device"]).
#  1. build and the full-size synthetic checkpoints (background);
#  2. tensor-core attention tests (row invariance, fp64 error, pipelined == direct staging) and the timing
#     line (call 16: 0.330 / 1.054 ms for 8 rows at 32K / 128K);
#  3. part treebench (call 16: tree-8 / stock = 1.068, 1.055, 1.040, 1.158 at 1K / 8K / 32K / 128K);
#  4. `elpis bench profile` of stock and elpis-tree8 at 1K (CUPTI kernel timeline: busy, idle and kernel
#     families per round; the tree verify is a graph replay, so its kernels are not labelled by module).
# $OUT returns at most 8 files: log, pytest.txt, treebench.{json,md,txt}, profile.{json,md}, caches part.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
gpu_pytest "mma kernel tests" 100 tests/kernels/test_tree_attention_mma.py -k "not timing"
wait_synth
gpu_pytest "mma timing" 60 tests/kernels/test_tree_attention_mma.py -k timing
TREEBENCH_MIN=110
( source elpis/bench/scripts/device_part_treebench.sh ) 2>&1 | tail -5
rm -f "$OUT/treebench.png"
save_caches > /dev/null 2>&1
if [ "$(left)" -gt 120 ]; then
  echo "=== profile stock vs elpis-tree8 at 1K ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 5 $(( $(left) - 10 )) python3 -m elpis.cli bench profile --systems stock,elpis-tree8 \
    --model /tmp/full/target --draft /tmp/full/draft --out-dir /tmp/profile --time-limit $(( $(left) - 25 )) \
    --checkpoints 1024 --profile-prefill "" --stem profile 2>&1 | grep -v "it/s\]$" | tail -30 | tee -a "$OUT/log"
  cp /tmp/profile/profile.json /tmp/profile/profile.md "$OUT/" 2>/dev/null
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
