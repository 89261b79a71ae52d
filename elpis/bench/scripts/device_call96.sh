#!/bin/bash
# Call 96 (staged in session 22; no device time was left to run it). The Gated DeltaNet tree kernel reads qkv
# through a layout since b45e1b4 (bit for bit under the CPU emulation; its staging code changed, its recurrence
# did not):
# 1. gdn_vs_previous.py against the kernel before it (.device/gdn_prev.cu = `git show
#    094370a:patches/kernels/gdn_tree.cu`): bits and time of the token-major path served today;
# 2. GPU tests of the kernel (channel-major = token-major among them), of the rows GEMM (its repeated and crowded
#    calls, run so far only against session 22's withdrawn build) and of tree verifies and their graphs;
# 3. one `elpis bench engine` of stock and elpis tree-16 as served (A); then device_call96_gdn_in_place.patch
#    applied (the tree conv reads the channel-major bf16 buffer stock casts for its conv in place: one copy a
#    Gated DeltaNet layer fewer, 48 a verify), the tree verify GPU tests again, and elpis tree-16 again (B).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
# (Ran as call 96 in session 23; the patch was then committed into tree_verify.py and removed.)
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
echo "=== gdn tree: layout against the previous kernel ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 120 python3 elpis/bench/scripts/gdn_vs_previous.py .device/gdn_prev.cu 2>&1 | grep GDNAB \
  | tee "$OUT/gdn_vs_previous.txt" | grep -E "timing|summary" | tee -a "$OUT/log"
gpu_pytest "gdn tree kernel, rows GEMM kernel, tree verify and graphs (A)" 170 tests/kernels/test_gdn_tree.py \
  tests/kernels/test_rows_gemm.py tests/exl3/test_tree_verify.py tests/exl3/test_tree_graph.py
wait_synth
export BENCH_MARGIN=200
engine_bench sameA 1 stock,elpis-tree16 12 3 "Stock vs elpis tree-16 as served (call 96 A), H200"
git apply elpis/bench/scripts/device_call96_gdn_in_place.patch && echo "applied the in-place patch" | tee -a "$OUT/log"
gpu_pytest "tree verify and graphs (B)" 100 tests/exl3/test_tree_verify.py tests/exl3/test_tree_graph.py
export BENCH_MARGIN=10
engine_bench sameB 1 elpis-tree16 12 3 "elpis tree-16, qkv read in place (call 96 B), H200"
rm -f "$OUT"/*.png
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
