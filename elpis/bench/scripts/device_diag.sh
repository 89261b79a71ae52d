#!/bin/bash
# Call 3 (diagnostic): which settings keep chain speculation bit-identical to plain decoding (small model).
LIMIT=230
source elpis/bench/scripts/device_common.sh
python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1
for cfg in replay-fp16 replay-fp32 draft-nopad; do timeout 60 python3 elpis/bench/scripts/lossless_diag.py $cfg 2>&1 | grep -E "DIAG|Error|error" | tail -3 | tee -a "$OUT/log"; done
EXL3_INT8_GEMV=0 timeout 60 python3 elpis/bench/scripts/lossless_diag.py draft-nopad-noint8 2>&1 | grep -E "DIAG|Error|error" | tail -3 | tee -a "$OUT/log"
