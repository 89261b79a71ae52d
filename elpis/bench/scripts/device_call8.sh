#!/bin/bash
# Call 8 (session 4, fresh machine): issue 8 with the quantized-cache attention wired into tree mode.
#  1. build (background) and the full-size synthetic checkpoints (/tmp/full/{target,draft});
#  2. part qcache: the quantized-read kernel against the fp16 kernel over get_kv, row invariance, timing
#     (after the ctypes signature fix);
#  3. part tree on the full-size model: tree-mode losslessness and row invariance, now through the quantized
#     read (no fp16 window);
#  4. where a tree-mode round's time goes: `elpis bench profile --systems elpis-tree16` at 1K and 32K.
# Run with ELPIS_GIT_REVISION set (the machine's .git is stale). Results under $OUT.
LIMIT=${LIMIT:-585}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
start_build_and_full_synth
wait_build
part qcache
wait_synth
export ELPIS_SMALL_DIR=/tmp/full
part tree
echo "=== tree profile ($(left) s left)" | tee -a "$OUT/log"
if [ "$(left)" -gt 100 ]; then
  timeout -k 5 $(( $(left) - 15 )) python3 -m elpis.cli bench profile --systems elpis-tree16 \
    --model /tmp/full/target --draft /tmp/full/draft --out-dir "$OUT/profile" --time-limit $(( $(left) - 30 )) \
    --checkpoints 1024,32768 --profile-prefill "" --stem profile-tree16 2>&1 | grep -v "it/s\]$" | tail -40 \
    | tee -a "$OUT/log"
fi
save_caches >/dev/null
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
