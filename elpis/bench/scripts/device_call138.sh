#!/bin/bash
# Call 138 (session 33): the served tree attention (b032579's source; call 137 found both other warp layouts
# slower and they were removed) under the served configuration's memory test, and how much the dequantisation's
# Hadamard butterflies cost it.
# 1. A diagnostic copy with no butterflies (.device/nohad/: the K half-groups skip theirs and the shuffle that
#    joins the halves, the V groups skip dequant_words'; its values are wrong, so its bits differ): timed beside
#    the served build (mma_vs_previous.py, "previous" is the copy) at 32K-262K. Its gain bounds what folding the
#    rotation into the query and the output could save (bench/results/tree/README.md, session 32's idea);
# 2. `pytest -m gpu tests/kernels` (every kernel's GPU tests);
# 3. the 24 GiB test at 262,000 tokens, tree-16 with graphs captured at load.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-560}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
mkdir -p .device/nohad
python3 - <<'PY' || exit 1
from pathlib import Path
src = Path("patches/kernels")
cu = (src / "tree_attention_mma.cu").read_text()
a = cu.index("    hadamard_butterflies(v);  // index bits 0..3")
b = cu.index("    if (!store) return;", a)
Path(".device/nohad/tree_attention_mma.cu").write_text(cu[:a] + cu[b:])
common = (src / "tree_attention_common.cuh").read_text()
body = "            v[j] = __fadd_rn(lo, hi);\n            v[j | b] = __fsub_rn(lo, hi);\n"
assert common.count(body) == 1
Path(".device/nohad/tree_attention_common.cuh").write_text(common.replace(body, "            (void)lo; (void)hi;\n"))
print("no-butterfly copy written")
PY
wait_build
wait_synth  # nothing else on the GPU while the kernels are timed
echo "=== attention: served against the copy with no butterflies ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 80 python3 elpis/bench/scripts/mma_vs_previous.py .device/nohad/tree_attention_mma.cu 32760 131050 262128 \
  2>&1 | tee "$OUT/mma-vs-nohad.txt" | grep -E 'timing|failures|Error' | tee -a "$OUT/log"
gpu_pytest "kernels' GPU tests" 150 tests/kernels
gib24_test "tree-16, served attention (b032579's source)" $(( $(left) - 10 ))
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
