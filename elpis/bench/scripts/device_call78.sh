#!/bin/bash
# Call 78 (written in session 18 as call 77; right after call 77 on the warm machine): issue 10's
# per-phase profile of a 32K prefill, stock and
# elpis-tree16 in one run, each window over the whole prompt (--prefill-window 0: elpis prefills a 32K prompt
# as one layer-major group); then a cold 128K prompt in the engine bench with the time left.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
full_model_ready
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
