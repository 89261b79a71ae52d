#!/bin/bash
# Call 104 (staged in session 23 for the next session): is a longer split past 64K better for the tree attention?
# Probe headers (timing probes, not proved): the served layout up to 65536, then a split every 1024 positions
# (`render_probe_layout.py .device/schedule-long1024 65536 1024`) or every 2048 (.device/schedule-long2048, the
# same with 2048). The previous 512 layout: .device/schedule-512, rendered from eba0e79's bend/ (plus
# `#define ELPIS_SCHED_SPLIT_MIN 512u`, which that header predates). Fewer splits past 64K mean fewer blocks and
# fewer partials; the partials are 212 MB written and read per layer at 262K with 16 rows, about as much as the
# 3-bit K/V (bench/results/tree/README.md, session 23). Blocks start longest split first, so longer splits no longer finish last.
# attention_splits.py: served against the previous 512 layout and both probes, graph form, 1K-262K, 8 and 16 rows.
# A winner changes the numerics, so it would ship only with its proof and a gate PASS under a rule written first.
# No `make build` on the device: carry [".whl", ".device", "build/kernels"].
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"
echo "=== attention layouts ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 $(( $(left) - 8 )) python3 elpis/bench/scripts/attention_splits.py "$OUT/attention-layouts.json" \
  previous=.device/schedule-512 long1024=.device/schedule-long1024 long2048=.device/schedule-long2048 2>&1 \
  | grep -E '^\{|Error' | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
