#!/bin/bash
# Call 198 (session 49; a fresh machine, LIMIT ~230): builds of the served tree attention (fold) for fewer rows
# a block, traded for registers so that two or three blocks share a multiprocessor (ELPIS_BUILD_MAX_ROWS,
# ELPIS_MMA_MIN_BLOCKS; bench/results/tree/README.md, session 48: the served kernel runs latency-bound at a
# quarter occupancy). For each build, mma_vs_previous.py against the served one: bits at 1K-262K with the rows it
# serves (random trees), then both timed at 32K, 128K and 262K (median of 30 CUDA-event times). The CPU
# emulation already found the 8-row build's bits equal (tests/kernels/test_tree_attention_mma_emu.py). Last, the
# served pick's GPU test (ROW_BUILDS against the 16-row build, occupancy, timing).
# It ran at 3d5eabd, where the last test was test_row_builds_keep_the_16_row_builds_bits and also checked a served
# pick of the 8-row build (removed after this call: slower); the same bits checks now carry the name below.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-230}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_once
variant() {  # NAME MAX_ROWS DEFINE...
  local name=$1 rows=$2; shift 2
  local defs=(); for d in "$@"; do defs+=(--define "$d"); done
  echo "=== $name ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 3 $(( $(left) - 20 )) python3 elpis/bench/scripts/mma_vs_previous.py patches/kernels/tree_attention_mma.cu \
    1000 4093 32760 131050 262000 --max-rows "$rows" "${defs[@]}" 2>&1 | tee "$OUT/$name.txt" \
    | grep -E 'timing|failures|Error|false|blocks per' | tee -a "$OUT/log"
}
variant rows8-min2 8 ELPIS_BUILD_MAX_ROWS=8 ELPIS_MMA_MIN_BLOCKS=2
variant rows8-min1 8 ELPIS_BUILD_MAX_ROWS=8
variant rows4-min2 4 ELPIS_BUILD_MAX_ROWS=4 ELPIS_MMA_MIN_BLOCKS=2
gpu_pytest "row builds against the 16-row build" $(( $(left) - 15 )) \
  "tests/kernels/test_tree_attention_mma.py::test_eight_row_build_keeps_the_16_row_builds_bits"
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
