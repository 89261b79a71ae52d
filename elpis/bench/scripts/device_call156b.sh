#!/bin/bash
# Call 156b (session 41), chained onto call 156's machine, at 52e25b8 (the build option ELPIS_GEMM_BYTESUM_MMA
# exists only there: it was measured slower and removed). Run inline then; kept here as it ran.
# 1. The EXL3 rows GEMM with the codebook's byte sums on the int8 tensor cores (ELPIS_GEMM_BYTESUM_MMA=1: one
#    mma.sync m16n8k32 per four products a lane, its B a routing of zeros and ones that hands each lane its own
#    sums back, instead of four dp4a) against the served build, on every GEMM call of a verify at 8 and 16 rows,
#    bit for bit and timed (rows_gemm_variants.py; each build twice);
# 2. call 156's three failing tests again with rounds on the GPU and the gather on, with full tracebacks, and the
#    rows GEMM's GPU tests (at 52e25b8 they include the byte-sum build against ExLlamaV3's decode).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-400}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build; join_build
cp patches/kernels/exl3_gemm_rows.cu /tmp/served_gemm.cu
timeout -k 5 150 python3 elpis/bench/scripts/rows_gemm_variants.py /tmp/served_gemm.cu "$OUT/variants-bytesum.json" \
  served= mma=ELPIS_GEMM_BYTESUM_MMA:1 served2= mma2=ELPIS_GEMM_BYTESUM_MMA:1 2>&1 | tail -18 | tee -a "$OUT/log"
export ELPIS_SMALL_DIR=/tmp/small ELPIS_PATCH_DEVICE_ROUNDS=1 ELPIS_PATCH_EMBED_GATHER=1
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs --tb=long \
  tests/exl3/test_draft_graph.py::test_draft_tree_speculation_through_replays_is_lossless \
  tests/exl3/test_gdn_ba_patch.py::test_product_path_with_the_patch \
  tests/exl3/test_tree_graph.py::test_graphs_captured_at_load_leave_nothing_to_capture \
  tests/kernels/test_rows_gemm.py > "$OUT/fail.txt" 2>&1
tail -5 "$OUT/fail.txt"
