#!/bin/bash
# Call 69 (session 17), after call 68: the load-time capture and draft graph tests passed there, but the
# snapshot worker thread copied into inference tensors outside inference mode (a thread-local mode), which
# failed the snapshot test and elpis's bench rows. Now: the snapshot, prefix reuse and disk restart tests,
# then the served prefill bench, stock and elpis-tree16 at 8K and 32K, with graphs captured at load (no
# captures in the first round), background snapshot copies and one torch thread between prefills.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_synths
wait_build
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "background snapshots, prefix reuse, disk restart" 150 \
  "tests/exl3/test_gpu.py::test_snapshot_copies_what_stash_copies" "tests/exl3/test_gpu.py::test_prefix_reuse_is_exact" \
  "tests/exl3/test_gpu.py::test_restart_reuses_disk_prefix"
wait_synth
served_bench prefillbench "issue 10: served prefill (graphs captured at load, background snapshots), stock vs elpis, H200" --spec-only
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
