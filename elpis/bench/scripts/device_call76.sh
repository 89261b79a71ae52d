#!/bin/bash
# Call 76 (session 19): the verify gate (`elpis.exl3.verify_gate`, registry switch exl3-verify-prelaunch).
# 1. GPU tests: the gate (gated verifies bitwise equal to replays, the drafter's product path, a timed-out gate
#    discarded and recomputed, an armed gate nobody opens), and session 18's untested capture code (grouped
#    prefill with inner snapshots and lazy staging; the snapshot against the stash through copy_all);
# 2. host_gaps.py at 1K and 8K on the full-size synthetic model, greedy tree-16 rounds, one torch thread, the
#    gate off, on, off, on in one process (12 timed rounds each): median round and GPU idle per round.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set, right after device_ext_build.sh (a checkout
# without .device/ext.so.xz.part-*): the extension it built stays in /tmp/torch_ext on the warm machine.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready  # on the machine device_ext_build.sh left warm: the build and checkpoints are there
[ -f /tmp/small/target/config.json ] || timeout -k 2 60 python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1
[ -n "${SKIP_TESTS:-}" ] || ELPIS_SMALL_DIR=/tmp/small gpu_pytest "verify gate; prefill groups with inner snapshots; snapshot vs stash" 220 \
  tests/exl3/test_verify_gate.py tests/exl3/test_prefill_groups.py \
  "tests/exl3/test_gpu.py::test_snapshot_copies_what_stash_copies"

echo "=== host gaps, gate off/on/off/on, 1K and 8K ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 $(( $(left) - 15 )) python3 elpis/bench/scripts/host_gaps.py /tmp/full/target /tmp/full/draft \
  --contexts 1024,8192 --threads 1 --prelaunch 0,1,0,1 --rounds 12 2>&1 | grep -E "^HOSTGAPS|Error|error" \
  | tee "$OUT/host_gaps.txt" | cut -c1-400 | tee -a "$OUT/log"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
