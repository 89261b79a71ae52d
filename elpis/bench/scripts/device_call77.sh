#!/bin/bash
# Call 77 (written in session 18 for the next session; right after call 76 on the warm machine): the grouped
# prefill GPU tests on the final capture code; issue 10's per-phase profile of a 32K prefill, stock and
# elpis-tree16 in one run, each window over the whole prompt (--prefill-window 0: elpis prefills a 32K prompt
# as one layer-major group); then a cold 128K prompt in the engine bench with the time left.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready
# the grouped-prefill and snapshot tests again: since call 72, inner snapshots take their staging buffer at
# their first copy, and save_state copies through StateCapture.copy_all
timeout -k 2 60 python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1 | tee -a "$OUT/log"
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "prefill groups with inner snapshots (lazy staging), snapshot" 170 -s \
  tests/exl3/test_prefill_groups.py "tests/exl3/test_gpu.py::test_snapshot_copies_what_stash_copies"
echo "=== profile, 32K prefill, whole prompt ($(left) s left)" | tee -a "$OUT/log"
timeout -k 5 240 python3 -m elpis.cli bench profile --systems stock,elpis-tree16 --tree-eager \
  --model /tmp/full/target --draft /tmp/full/draft --out-dir /tmp/profile --time-limit 230 \
  --checkpoints 32768 --profile-prefill 32768 --prefill-window 0 --rounds 3 --warmup 1 \
  --stem profile-prefill32k 2>&1 | grep -E "^\| (prefill|spec|plain)|Errors|^- " | head -12 | tee -a "$OUT/log"
cp /tmp/profile/profile-prefill32k.json /tmp/profile/profile-prefill32k.md "$OUT/" 2>/dev/null
bench_rest bench128k "issue 10: cold 128K prompt, groups of sixteen, stock vs elpis, H200" \
  --checkpoints 131072 --rounds 3 --warmup 1 --final-tokens 0 --spec-only
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
