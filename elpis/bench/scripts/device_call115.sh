#!/bin/bash
# Call 115 (session 25, the last device minutes): the GDN tree kernel's staging with the v inputs one element a
# thread and the taps' and gates' loads issued with the q/k channel's, against call 114's committed source
# (.device/gdn_c114.cu) and d63cb6e's (.device/gdn_prev.cu): bits and device time (gdn_vs_previous.py, which
# needs no acceptor build), then the timeline.
# Run with run(carry=[".whl", ".device", "build/kernels"]).
LIMIT=${LIMIT:-280}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
for prev in gdn_c114 gdn_prev; do
  echo "=== gdn_vs_previous $prev ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 3 100 python3 elpis/bench/scripts/gdn_vs_previous.py .device/$prev.cu 2>&1 \
    | grep -E 'GDNAB \{"check": "(timing|summary)|"identical": false|Error' | tee -a "$OUT/log"
done
echo "=== timeline ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 $(( $(left) - 5 )) python3 elpis/bench/scripts/gdn_tree_timeline.py "$OUT/gdn-timeline.json" 2>&1 \
  | grep -E '^\{|Error' | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
