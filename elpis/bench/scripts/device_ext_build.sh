#!/bin/bash
# A fresh checkout has no prebuilt ExLlamaV3 extension to carry (.device/ext.so.xz.part-*), and building it
# here takes ~50 min on 2 cores against ~5 min on the GPU machine's 16. This call JIT-builds it there for sm_90
# with the image's torch and sends it back in parts (put them under .device/), while `elpis build` and the
# checkpoints (/tmp/full, /tmp/small) are made beside it, so a call chained right after (warm machine, /tmp
# kept) starts at its tests. Run with run(carry=[".whl"]).
LIMIT=${LIMIT:-590}
T0=$(date +%s)
ELPIS_EXT_BUILD=1 source elpis/bench/scripts/device_common.sh
gpu_line
ELPIS_PROVE_JOBS=6 start_build  # six prover jobs beside the extension's sixteen compiler jobs
( time python3 -c "import exllamav3.ext" ) >/tmp/ext-build.log 2>&1
tail -3 /tmp/ext-build.log | tee -a "$OUT/log"
SO=/tmp/torch_ext/exllamav3_ext/exllamav3_ext.so
[ -f "$SO" ] || { tail -30 /tmp/ext-build.log | tee -a "$OUT/log"; exit 1; }
xz -T16 -6 -c "$SO" | split -b 15M - "$OUT/ext.so.xz.part-"
( python3 -m elpis.cli synth --full /tmp/full/target && python3 -m elpis.cli synth --draft /tmp/full/draft ) \
  >/tmp/synth_full.log 2>&1 &
SYNTH=$!
timeout -k 2 90 python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1 | tee -a "$OUT/log"
wait_build
wait "$SYNTH"; tail -1 /tmp/synth_full.log | tee -a "$OUT/log"
ls -la "$OUT" | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
