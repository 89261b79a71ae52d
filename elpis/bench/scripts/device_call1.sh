#!/bin/bash
# Call 1: JIT-build the exllamav3 extension for sm_90 and bring it back, then the small synthetic model's
# quick checks (a short stock-vs-elpis engine run and the GPU tests), then the Triton/autotune caches.
LIMIT=585
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv | tee -a "$OUT/log"
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" | tee -a "$OUT/log"
( time python3 -c "import exllamav3.ext" ) 2>&1 | tail -15 | tee -a "$OUT/log"
so=$(find /tmp/torch_ext -name 'exllamav3_ext*.so' | head -1)
if [ -n "$so" ]; then
  xz -T16 -6 -c "$so" | split -b 15M - "$OUT/ext.so.xz.part-"
  mkdir -p /tmp/extmod && cp "$so" /tmp/extmod/exllamav3_ext.so
fi
echo "build done at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
timeout $(( $(left) - 20 )) python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -3 | tee -a "$OUT/log"
timeout $(( $(left) * 45 / 100 )) python3 -m elpis.cli bench engine --model /tmp/small/target --draft /tmp/small/draft \
  --out-dir "$OUT" --stem small --checkpoints 1024,4096 --rounds 8 --warmup 2 --time-limit $(( $(left) * 40 / 100 )) \
  --model-note "synthetic --small (8 layers, hidden 1024)" 2>&1 | tail -60 | tee -a "$OUT/log"
save_caches
ELPIS_SMALL_DIR=/tmp/small timeout $(( $(left) - 25 )) python3 -m pytest -m gpu tests/exl3 -q -p no:cacheprovider \
  -k "not 24gib" 2>&1 | tail -60 | tee -a "$OUT/log"
save_caches
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
