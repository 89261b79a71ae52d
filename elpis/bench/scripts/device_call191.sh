#!/bin/bash
# Call 191 (session 47; a fresh machine, LIMIT ~470): eager tree verifies on the graphs' module path.
# Call 190's eager profile at 262K showed elpis tree-8's MLPs in ExLlamaV3's `exl3_gemm_kernel` (x192), where
# a replayed verify runs the rows GEMM: an eager verify of at most 8 rows took ExLlamaV3's graph-captured MLP
# blocks. `_verify_tree` now runs under `capture.plain_module_path`, as captures and their warm-ups do.
# 1. tests/exl3/test_tree_graph.py on the small model: 8-row replays now compared with the eager tree mode
#    bit for bit (the old code's eager 8-row verifies ran other kernels), and the rest of the file;
# 2. with time left, the eager profile of elpis tree-8 alone at 262K again (stock's is call 190's), its MLPs now
#    in the rows GEMM as served.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-470}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
defaults_on_small_model
gpu_pytest "tree graphs against the eager tree mode at 8 and 16 rows" 150 tests/exl3/test_tree_graph.py
finish_full_synth
STEM=profile-262k-tree8-call191
if [ "$(left)" -gt 190 ] && [ -f /tmp/full/draft/config.json ]; then
  echo "=== profile elpis-tree8 at 262K, eager tree verifies ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 5 $(( $(left) - 8 )) python3 -m elpis.cli bench profile --systems elpis-tree8 --tree-eager \
    --model /tmp/full/target --draft /tmp/full/draft --out-dir "$OUT" --time-limit $(( $(left) - 20 )) \
    --checkpoints 262000 --rounds 4 --warmup 1 --final-tokens 0 --spec-only --profile-prefill "" --stem "$STEM" \
    > "$OUT/$STEM.txt" 2>&1
  echo "profile: exit $?" | tee -a "$OUT/log"
  grep -E "^\| spec" "$OUT/$STEM.md" 2>/dev/null | tee -a "$OUT/log"
  grep -o "spec 262K elpis-tree8: .*" "$OUT/$STEM.md" 2>/dev/null | grep -o "mlp: [^;]*" | tee -a "$OUT/log"
fi
rm -f "$OUT"/*.png
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
