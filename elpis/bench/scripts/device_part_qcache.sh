#!/bin/bash
# Part "qcache" (issue 8: verify scratch, reads of the 3-bit cache): the tree-verify attention reading
# ExLlamaV3's quantized paged cache directly (ELPIS_TREE_ATTN_QCACHE build of
# patches/kernels/tree_attention.cu, elpis.exl3.tree_attention.tree_attention_qcache) on cache pages written
# by ExLlamaV3 (CacheLayer_quant.update_kv_direct of random K/V): our dequant reference
# (elpis/exl3/qcache_ref.py) equals CacheLayer_quant.get_kv bit for bit; the quantized-read kernel equals the
# fp16 kernel over get_kv's pages bit for bit at ctx 503..32760 with 2/9/16 rows; row invariance against
# 1-row calls; then one timing JSON line at 32K (8 and 16 rows: quantized read, fp16 kernel alone, and the
# engine's path today = window dequant + fp16 kernel). Sourced after device_common.sh (PYTHONPATH, $OUT,
# `left`), with `python3 -m elpis.cli build` already run. nvcc builds two libraries (fp16 staged and
# quantized 3/3) for the current GPU. Budget: at most 60 s wall.
echo "== part qcache: tree attention over the quantized cache ($(date -u +%H:%M:%S))" | tee -a "$OUT/log"
qc_budget=$(left)
if [ "$qc_budget" -gt 60 ]; then qc_budget=60; fi
if [ "$qc_budget" -lt 15 ]; then
  echo "part qcache: skipped, only ${qc_budget}s left" | tee -a "$OUT/log"
elif [ ! -f build/kernels/verify_schedule.h ]; then
  echo "part qcache: skipped, build/kernels/verify_schedule.h missing (elpis build failed?)" | tee -a "$OUT/log"
else
  qc_t0=$(date +%s)
  # correctness first, leaving ~12 s for the timing line (both kernel libraries are cached by then)
  ELPIS_KERNEL_LOG="$OUT/log" timeout -k 3 $(( qc_budget - 12 )) python3 -m pytest -m gpu \
    tests/kernels/test_tree_attention_qcache.py -k "not timing" -q -p no:cacheprovider -rfEs --durations=5 \
    --tb=short 2>&1 | tee "$OUT/qcache_pytest.txt" | tail -25 | tee -a "$OUT/log"
  echo "part qcache: correctness exit ${PIPESTATUS[0]}" | tee -a "$OUT/log"
  qc_rest=$(( qc_budget - ($(date +%s) - qc_t0) ))
  if [ "$qc_rest" -ge 6 ]; then
    ELPIS_KERNEL_LOG="$OUT/log" timeout -k 2 "$qc_rest" python3 -m pytest -m gpu \
      tests/kernels/test_tree_attention_qcache.py -k timing -q -p no:cacheprovider -rfEs 2>&1 | tail -4 \
      | tee -a "$OUT/log"
    echo "part qcache: timing exit ${PIPESTATUS[0]}" | tee -a "$OUT/log"
  else
    echo "part qcache: timing skipped, only ${qc_rest}s left" | tee -a "$OUT/log"
  fi
fi
