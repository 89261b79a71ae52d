#!/bin/bash
# Call 121 (session 27): the round's host path. Call 119 found the verify's input fill still 0.31 ms with the
# embedding gather on, and call 120 timed a fresh pinned upload at ~0.09 ms of host time against ~0.02-0.05 ms for
# a reused pinned twin; the round makes about ten small uploads on the host's path. Since then every upload of a
# round goes through `upload.Staged` (reused twins behind an event), and the draft graph's gather copies its mask
# rows on every call (call 119's draft tests).
# 1. GPU tests with the gather on: the gather's tests, the draft graphs (conditioning through Staged), Staged
#    itself;
# 2. the round, same run: the package as this session began (.ab/old, d355a13) against this tree with the
#    gather off and on, alternating twice (stock chain-8 in the first run);
# 3. host_gaps.py at 1K and 8K with the gather on, one torch thread, no profiler: the host's time per step.
# Run with run(carry=[".whl", ".device", ".ab"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
REPO=$PWD
start_build_and_synths
wait_build
rm -rf .ab/old/build && cp -r build .ab/old/build  # the acceptor and proved headers: bend/ is unchanged since
ELPIS_PATCH_EMBED_GATHER=1 gpu_pytest "embedding gather, draft graphs, staged uploads (gather on)" 170 \
  tests/exl3/test_embed_gather.py tests/exl3/test_draft_graph.py tests/exl3/test_upload.py
wait_synth
old_bench() {  # STEM SYSTEMS TITLE: engine_bench of the package in .ab/old
  ( cd "$REPO/.ab/old" && ELPIS_GIT_REVISION=d355a13 PYTHONPATH=/tmp/extmod:/tmp/site:$REPO/.ab/old \
    engine_bench "$1" 1 "$2" 12 3 "$3" )
}
for pass in 1 2; do
  systems=elpis-tree16; [ $pass = 1 ] && systems=stock,elpis-tree16
  [ "$(left)" -gt 70 ] && old_bench "round-host-old-$pass" "$systems" "session start (d355a13) $pass"
  [ "$(left)" -gt 60 ] && ELPIS_PATCH_EMBED_GATHER=0 engine_bench "round-host-new-$pass" 1 elpis-tree16 12 3 \
    "staged uploads $pass"
  [ "$(left)" -gt 60 ] && ELPIS_PATCH_EMBED_GATHER=1 engine_bench "round-host-gather-$pass" 1 elpis-tree16 12 3 \
    "staged uploads and gather $pass"
done
if [ "$(left)" -gt 70 ]; then
  echo "=== host gaps, gather on, 1K and 8K, no profiler ($(left) s left)" | tee -a "$OUT/log"
  ELPIS_PATCH_EMBED_GATHER=1 timeout -k 5 $(( $(left) - 8 )) python3 elpis/bench/scripts/host_gaps.py \
    /tmp/full/target /tmp/full/draft --contexts 1024,8192 --threads 1 --rounds 24 --profile 0 2>&1 \
    | grep -E "^HOSTGAPS|Error|error" | tee "$OUT/host_gaps_staged.txt" | sed -E 's/"round_ms": \[[^]]*\], //' \
    | cut -c1-900 | tee -a "$OUT/log"
fi
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
pack_outputs
