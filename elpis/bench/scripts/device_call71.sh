#!/bin/bash
# Call 71 (written in session 17 for the next session): the served bench at 8K and 32K with fresh TTFTs
# (new prompts, nothing cached) beside the cumulative ones, stock and elpis-tree16. Session 17's call 69
# measured 8,520 / 7,695 tok/s cumulative; its stock 32K was disturbed. No --spec-only, so stock also
# measures plain steps and both measure fresh TTFTs while time remains.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
if [ ! -f /tmp/full/draft/config.json ]; then  # a fresh machine: build and synthesise first
  start_build_and_full_synth
  wait_build
  wait_synth
fi
served_bench freshbench "issue 10: served prefill, cumulative and fresh TTFT, stock vs elpis, H200"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
