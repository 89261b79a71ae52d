#!/bin/bash
# Call 95 (session 22): call 94's GEMM with the input tasks ran twice as long, most likely because every waiting warp
# made a compare-and-swap on each pending task's word in turn. The wait now reads the states with plain loads and
# steals only a task still free on a second look. Its build with each fragment load (ELPIS_GEMM_FRAG_LOAD: 0 the
# read-only path as served before, 1 L2 only as in call 94, 2 ld.ca) against the served two-launch source.
# No `make build`: carry [".whl", ".device", "build/kernels"].
LIMIT=${LIMIT:-300}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
echo "=== rows GEMM: input tasks, fragment loads ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 200 python3 elpis/bench/scripts/rows_gemm_variants.py .device/served_gemm.cu "$OUT/variants.json" \
  ldg=ELPIS_GEMM_FRAG_LOAD:0 ldcg=ELPIS_GEMM_FRAG_LOAD:1 ldca=ELPIS_GEMM_FRAG_LOAD:2 2>&1 | tail -18 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
