#!/bin/bash
# Call 1: JIT-build the exllamav3 extension for sm_90 (and, alongside, the proven acceptor for this
# interpreter), bring both back; then the small synthetic model's quick checks (a short stock-vs-elpis
# engine run and the GPU tests); then the Triton/autotune caches.
LIMIT=585
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv | tee -a "$OUT/log"
python3 -c "import torch, triton, numpy; print(torch.__version__, torch.version.cuda, triton.__version__, numpy.__version__)" | tee -a "$OUT/log"
( timeout 400 python3 -m elpis.cli build > /tmp/accept_build.log 2>&1; echo "accept build rc=$?" >> /tmp/accept_build.log ) &
( time python3 -c "import exllamav3.ext" ) 2>&1 | tail -15 | tee -a "$OUT/log"
so=$(find /tmp/torch_ext -name 'exllamav3_ext*.so' | head -1)
if [ -n "$so" ]; then
  xz -T16 -6 -c "$so" | split -b 15M - "$OUT/ext.so.xz.part-"
  mkdir -p /tmp/extmod && cp "$so" /tmp/extmod/exllamav3_ext.so
fi
echo "ext build done at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
timeout $(( $(left) - 20 )) python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -3 | tee -a "$OUT/log"
wait
tail -5 /tmp/accept_build.log | tee -a "$OUT/log"
LOOP=direct
if python3 -c "from elpis import accept; print(accept.chain([], [1], [], 1))" 2>&1 | tee -a "$OUT/log" | grep -q ChainDecision; then
  LOOP=spec; tar -C build -cJf "$OUT/accept-cp312.tar.xz" accept
fi
echo "elpis loop: $LOOP at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
timeout $(( $(left) * 45 / 100 )) python3 -m elpis.cli bench engine --model /tmp/small/target --draft /tmp/small/draft \
  --out-dir "$OUT" --stem small --checkpoints 1024,4096 --rounds 8 --warmup 2 --time-limit $(( $(left) * 40 / 100 )) \
  --elpis-loop $LOOP --model-note "synthetic --small (8 layers, hidden 1024)" 2>&1 | tail -40 | tee -a "$OUT/log"
save_caches
ELPIS_SMALL_DIR=/tmp/small timeout $(( $(left) - 25 )) python3 -m pytest -m gpu tests/exl3 -q -p no:cacheprovider \
  -k "not 24gib" 2>&1 | tail -60 | tee -a "$OUT/log"
save_caches
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
