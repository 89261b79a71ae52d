# Shared setup for runs on the lent GPU machine (sourced by the device_*.sh scripts).
# Installs the carried wheels, puts a carried prebuilt exllamav3 extension and acceptor in place, points
# Triton and the EXL3 autotuner at caches that come back through $OUT.
set -u
export PYTHONUNBUFFERED=1
T0=${T0:-$(date +%s)}
left() { echo $(( ${LIMIT:-590} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
for t in .whl/*.site.tar.xz; do [ -f "$t" ] && { tar -C /tmp/site -xJf "$t" || exit 1; }; done
export PYTHONPATH=/tmp/site:$PWD
export TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 TORCH_EXTENSIONS_DIR=/tmp/torch_ext
export TRITON_CACHE_DIR=/tmp/triton EXLLAMAV3_TUNE_CACHE=/tmp/tune/coop_autotune_v1.bin
mkdir -p /tmp/tune /tmp/triton "$OUT"
if ls .device/ext.so.xz.part-* >/dev/null 2>&1; then
  mkdir -p /tmp/extmod && cat .device/ext.so.xz.part-* | xz -d > /tmp/extmod/exllamav3_ext.so
  export PYTHONPATH=/tmp/extmod:$PYTHONPATH
elif [ "${ELPIS_EXT_BUILD:-0}" != 1 ]; then
  # Without it, the first `import exllamav3` (the kernel tests' quantized caches too) JIT-builds the extension
  # for ~5 min, silently: calls 133 and 134 lost their limits to that. Only device_ext_build.sh wants that.
  echo "no prebuilt exllamav3 extension (.device/ext.so.xz.part-*): run prepare_device_carry.sh on this" \
    "machine, or device_ext_build.sh on the GPU machine, first" | tee -a "$OUT/log"
  exit 3
fi
if ls .device/caches.tar.xz.part-* >/dev/null 2>&1; then cat .device/caches.tar.xz.part-* | tar -C /tmp -xJf -; fi
if [ -d .device/accept-cp312 ]; then mkdir -p build && rm -rf build/accept && cp -r .device/accept-cp312 build/accept; fi
save_caches() { rm -f "$OUT"/caches.tar.xz.part-*; tar -C /tmp -cf - triton tune 2>/dev/null | xz -T16 -1 | split -b 15M - "$OUT/caches.tar.xz.part-"; ls -la "$OUT"; }
# A fresh machine's first steps: the GPU line in the log, `elpis build` in the background and the full-size
# synthetic checkpoints (/tmp/full/{target,draft}) beside it; wait_build / wait_synth join them. A call chained
# onto a warm machine (its /tmp and build/ kept) skips what an earlier call of this revision already made: the
# machine is released after 30 s idle, and 80-100 s of build per call is a sixth of a session's device time.
BUILT_MARK=/tmp/.elpis-built-${ELPIS_GIT_REVISION:-unknown}
gpu_line() { nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/log"; }
# start_build: `elpis build` of this revision in the background (BUILD its pid), or nothing (BUILD empty) when
# this warm machine built it already. join_build waits for it (a failed build ends the script), wait_build
# waits without ending it; both put the build's identity and time in the log.
start_build() {
  export ELPIS_PROVE_JOBS=${ELPIS_PROVE_JOBS:-14}
  BUILD=
  if [ -f "$BUILT_MARK" ] && [ -d build/accept ]; then
    echo "build: kept from an earlier call of this revision" > /tmp/build.log
  else
    ( time python3 -m elpis.cli build && touch "$BUILT_MARK" ) >/tmp/build.log 2>&1 &
    BUILD=$!
  fi
}
build_summary() { grep -E "identity|^real|kept" /tmp/build.log | tail -3 | tee -a "$OUT/log"; }
join_build() {
  [ -z "${BUILD:-}" ] || wait "$BUILD" || { tail -20 /tmp/build.log | tee -a "$OUT/log"; exit 1; }
  build_summary
}
wait_build() { [ -z "${BUILD:-}" ] || wait "$BUILD"; build_summary; }
start_build_and_full_synth() {
  gpu_line
  start_build
  start_full_synth
}
# The full-size checkpoints alone, in the background (call 142 makes them beside its tests for a chained call).
start_full_synth() {
  SYNTH=
  if [ -f /tmp/full/draft/config.json ]; then
    echo "synth: /tmp/full kept from an earlier call" > /tmp/synth_full.log
  else
    ( python3 -m elpis.cli synth --full /tmp/full/target && python3 -m elpis.cli synth --draft /tmp/full/draft ) \
      >/tmp/synth_full.log 2>&1 &
    SYNTH=$!
  fi
}
# The same with the small synthetic model (/tmp/small) made beside the build; returns once both are done (a
# failed build ends the script).
build_and_small_synth() {
  gpu_line
  start_build
  [ -f /tmp/small/draft/config.json ] || timeout -k 2 60 python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1 \
    | tee -a "$OUT/log"
  join_build
}
wait_synth() { [ -z "${SYNTH:-}" ] || wait "$SYNTH"; tail -1 /tmp/synth_full.log | tee -a "$OUT/log"; }
# build_once: the build alone, in the foreground (for calls that need no checkpoints).
build_once() { gpu_line; start_build; join_build; }
# finish_full_synth: wait for a background synthesis until 8 s before the call's limit; one still running then is
# stopped and its half-written /tmp/full removed (`elpis synth` refuses to write over it in a later call).
finish_full_synth() {
  [ -n "${SYNTH:-}" ] || return 0
  while kill -0 "$SYNTH" 2>/dev/null && [ "$(left)" -gt 8 ]; do sleep 1; done
  if kill -0 "$SYNTH" 2>/dev/null; then
    pkill -P "$SYNTH"; kill "$SYNTH"; sleep 1; rm -rf /tmp/full
    echo "synth: stopped unfinished, /tmp/full removed" | tee -a "$OUT/log"
  else
    wait_synth
  fi
}
# Both started and waited for, when the call has nothing to do meanwhile.
build_and_full_synth() { start_build_and_full_synth; wait_build; wait_synth; }
# Both checkpoint sizes: the build and the full-size synthesis in the background, the small model (/tmp/small)
# made meanwhile.
start_build_and_synths() {
  start_build_and_full_synth
  timeout -k 2 60 python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1 | tee -a "$OUT/log"
}
# small_model_defaults: the small model set for the GPU tests, and every patch switch left to the registry's
# defaults.
small_model_defaults() {
  export ELPIS_SMALL_DIR=/tmp/small
  unset ELPIS_PATCH_DEVICE_ROUNDS ELPIS_PATCH_EMBED_GATHER ELPIS_PATCH_ROUND_GRAPH ELPIS_PATCH_DRAFT_CANDIDATES
}
# defaults_on_small_model: the build and both synths started, the build joined, then small_model_defaults (the
# full-size synthesis still running).
defaults_on_small_model() {
  start_build_and_synths
  join_build
  small_model_defaults
}
# small_model_only: build_and_small_synth, then small_model_defaults (no full-size synthesis).
small_model_only() {
  build_and_small_synth
  small_model_defaults
}
# systems_bench STEM TAIL TITLE [SYSTEMS]: `elpis bench engine` of SYSTEMS (default stock, elpis chain-8, tree-8 and
# tree-16) on /tmp/full at 1K and 8K, rounds and plain decode, ending TAIL s before the call's limit;
# $OUT/STEM.{json,md,png,txt}, its rows and notes in the log.
systems_bench() {
  local stem=$1 tail=$2 title=$3 systems=${4:-stock,elpis,elpis-tree8,elpis-tree16}
  echo "=== bench $stem ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 5 $(( $(left) - tail )) python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
    --systems "$systems" --checkpoints 1024,8192 --rounds 12 --warmup 3 --final-tokens 0 \
    --time-limit $(( $(left) - tail - 10 )) --out-dir "$OUT" --stem "$stem" --title "$title" > "$OUT/$stem.txt" 2>&1
  echo "bench $stem: exit $?" | tee -a "$OUT/log"
  grep -E "^\| (stock|elpis)|^\| [0-9]+K|note|Error" "$OUT/$stem.md" "$OUT/$stem.txt" 2>/dev/null | head -40 \
    | tee -a "$OUT/log"
}
# sampler_time [LIMIT]: elpis/bench/scripts/sampler_time.py (no build or checkpoint needed; at most LIMIT s, 60 by
# default), its SAMPLER line in the log.
sampler_time() { timeout -k 3 "${1:-60}" python3 elpis/bench/scripts/sampler_time.py ${SAMPLER_ARGS:-} 2>&1 | tail -3 | tee -a "$OUT/log"; }
# penalty_rounds CONTEXTS [ARGS...]: elpis/bench/scripts/penalty_rounds.py on /tmp/full at CONTEXTS (e.g.
# 1024,8192), 40 tokens, 3 pairs, tree-16, ARGS (e.g. --grammar) passed on, ending 8 s before the call's limit;
# $OUT/penalty-rounds.json and $OUT/penalty.txt, its lines in the log.
penalty_rounds() {
  local contexts=$1
  shift
  echo "=== penalty rounds ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 5 $(( $(left) - 8 )) python3 elpis/bench/scripts/penalty_rounds.py /tmp/full/target /tmp/full/draft \
    --out "$OUT/penalty-rounds.json" --contexts "$contexts" --tokens 40 --pairs 3 --budget 16 "$@" \
    > "$OUT/penalty.txt" 2>&1
  echo "penalty rounds: exit $?" | tee -a "$OUT/log"
  grep -E "PENALTYAB|Error|error" "$OUT/penalty.txt" | head -10 | tee -a "$OUT/log"
}
# engine_bench STEM PATCH SYSTEMS ROUNDS WARMUP TITLE: one `elpis bench engine` run of SYSTEMS on /tmp/full at
# 1K and 8K, speculative rounds only, with ELPIS_PATCH_ROWS_GEMM=PATCH; writes $OUT/STEM.{json,md,png,txt} and
# puts its context rows in the log. It stops $BENCH_MARGIN s (default 20) before the call's limit.
engine_bench() {
  local stem=$1 patch=$2 systems=$3 rounds=$4 warmup=$5 title=$6 margin=${BENCH_MARGIN:-20}
  echo "=== bench $stem ($(left) s left)" | tee -a "$OUT/log"
  ELPIS_PATCH_ROWS_GEMM=$patch timeout -k 5 $(( $(left) - margin )) python3 -m elpis.cli bench engine \
    --model /tmp/full/target --draft /tmp/full/draft --systems "$systems" --checkpoints 1024,8192 \
    --rounds "$rounds" --warmup "$warmup" --final-tokens 0 --spec-only --time-limit $(( $(left) - margin - 10 )) \
    --out-dir "$OUT" --stem "$stem" --title "$title" > "$OUT/$stem.txt" 2>&1
  echo "bench $stem: exit $?" | tee -a "$OUT/log"
  grep -E "^\| [0-9]+K" "$OUT/$stem.md" 2>/dev/null | head -8 | tee -a "$OUT/log"
}
# engine_switch_ab STEM TITLE VAR...: alternating `elpis bench engine` runs of elpis-tree16 with the switch variables
# VAR... all 0, 1, 0, 1 (stock beside it in the first run), $OUT/STEM-{off,on}-{1,2}.*, for ab_pooled.py (arm A
# the "on" runs); a run starts only with more than a minute left; the variables are unset afterwards. Separate
# processes, one backend each; switch_ab.py compares two backends in one process, alternating requests.
engine_switch_ab() {
  local stem=$1 title=$2 run state systems var
  shift 2
  for run in off-1 on-1 off-2 on-2; do
    state=0; [ "${run%-*}" = on ] && state=1
    for var in "$@"; do export "$var=$state"; done
    systems=elpis-tree16; [ $run = off-1 ] && systems=stock,elpis-tree16
    [ "$(left)" -gt 60 ] && engine_bench "$stem-$run" 1 "$systems" 12 3 "$title $run"
  done
  for var in "$@"; do unset "$var"; done
}
# model_gate LABEL ARM...: `elpis gate model` on the small model (/tmp/small, its fp64 reference /tmp/small-deq),
# 32,768 pseudo-random ids, 8 WikiText-shaped chunks of 512; ARM is NAME=SPEC; $OUT/gate/model-LABEL-*.{json,npz}
# and the ledger lines. The caller sets the patch switches its arms need in the environment.
model_gate() {
  local label=$1 ref="device=cuda:0,model=/tmp/small-deq,path=prefill" arms=()
  shift
  for arm in "$@"; do arms+=(--arm "$arm"); done
  echo "=== gate model $label ($(left) s left)" | tee -a "$OUT/log"
  mkdir -p "$OUT/gate"
  timeout -k 3 200 python3 -m elpis.cli gate model --model /tmp/small/target \
    --random-ids 32768 --label "$label" --results "$OUT/gate" --wikitext-chunks 8 --wikitext-tokens 512 --gsm8k 0 \
    --aime 0 --greedy-prompts 0 --reference "reference:dtype=fp64,$ref" "${arms[@]}" \
    2>&1 | grep -v "^\s*$" | tail -16 | tee -a "$OUT/log"
}
# rows_gemm_model_gate LABEL: the patch rows-gemm's arms (rule exl3-small-rows-gemm-r2): floors tree mode with
# ExLlamaV3's GEMMs and stock, the candidate under the checkout's kernel code.
rows_gemm_model_gate() {
  local code
  code=$(python3 -c "from elpis.exl3.gate import code_digest; print(code_digest(['rows-gemm']))")
  ELPIS_PATCH_ROWS_GEMM=1 model_gate "$1" \
    "floor-tree=exl3:patches=gdn-state-fp32+tree-verify,rows=8" \
    "floor-stock=exl3:patches=none,rows=8" \
    "rows-gemm=exl3:code=$code,patches=gdn-state-fp32+rows-gemm+tree-verify,rows=8"
}
# tree_profile MARGIN: `elpis bench profile` of stock and elpis-tree16 at 1K and 8K with eager tree verifies (a
# replayed graph opens no profiler window), on /tmp/full, ending MARGIN s before the call's limit;
# $OUT/profile.{json,md} and the report's last lines in the log.
tree_profile() {
  local margin=$1
  echo "=== profile stock vs elpis-tree16, eager tree verifies ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 5 $(( $(left) - margin )) python3 -m elpis.cli bench profile --systems stock,elpis-tree16 --tree-eager \
    --model /tmp/full/target --draft /tmp/full/draft --out-dir /tmp/profile --time-limit $(( $(left) - margin - 10 )) \
    --checkpoints 1024,8192 --profile-prefill "" --stem profile 2>&1 | grep -v "it/s\]$" | tail -30 | tee -a "$OUT/log"
  cp /tmp/profile/profile.json /tmp/profile/profile.md "$OUT/" 2>/dev/null
}
part() {  # name: run one part's script (each bounds itself by `left`)
  echo "=== $1 ($(left) s left)" | tee -a "$OUT/log"
  ( source "elpis/bench/scripts/device_part_$1.sh" ) 2>&1 | tail -30
}
# gpu_pytest TITLE LIMIT ARGS...: one `pytest -m gpu` run of at most LIMIT s, its output appended to
# $OUT/pytest.txt, the tests' JSON lines (ELPIS_KERNEL_LOG / ELPIS_TREE_LOG) and its outcome in the log.
gpu_pytest() {
  local title=$1 limit=$2 rc
  shift 2
  echo "=== $title ($(left) s left)" | tee -a "$OUT/log"
  ELPIS_KERNEL_LOG="$OUT/log" ELPIS_TREE_LOG="$OUT/log" timeout -k 3 "$limit" python3 -m pytest -m gpu -q \
    -p no:cacheprovider -rfEs --tb=short "$@" >> "$OUT/pytest.txt" 2>&1
  rc=$?
  LAST_PYTEST_RC=$rc  # for a script that runs a later step only when these tests passed
  echo "$title: exit $rc" | tee -a "$OUT/log"
  tail -40 "$OUT/pytest.txt" | grep -E "passed|failed|^FAILED|^E |\"24gib\"" | tail -8 | tee -a "$OUT/log"
}
# At most 8 files come back from $OUT (2 folders deep): past that, everything but the log goes back as one
# archive, $OUT/out.tar (session 12's call 47 lost six files to the limit).
pack_outputs() {
  local count
  count=$(find "$OUT" -type f | wc -l)
  if [ "$count" -gt 8 ]; then
    ( cd "$OUT" && find . -type f ! -name log ! -name out.tar -print0 | tar --null -cf out.tar -T - --remove-files )
    echo "packed $count files into out.tar" | tee -a "$OUT/log"
  fi
}
# gib24_test TITLE [LIMIT] [MODE]: the 24 GiB test at 262,000 tokens (MODE tree-16, the default, with graphs;
# chain-8; or tree-16-device-rounds, the served generator's greedy rounds on the GPU) on /tmp/full, with the
# patch switches the caller set in the environment, for at most LIMIT s (default: until 10 s before the call's
# limit); $OUT/gib24_pytest.txt (chain-8: gib24_chain_pytest.txt; device rounds: gib24_device_rounds_pytest.txt),
# its JSON line in the log.
gib24_test() {
  local mode=${3:-tree-16} file=gib24_pytest.txt
  [ "$mode" = chain-8 ] && file=gib24_chain_pytest.txt
  [ "$mode" = tree-16-device-rounds ] && file=gib24_device_rounds_pytest.txt
  echo "=== 24 GiB $mode, $1 ($(left) s left)" | tee -a "$OUT/log"
  ELPIS_FULL_TARGET=/tmp/full/target ELPIS_FULL_DRAFT=/tmp/full/draft \
    timeout -k 3 "${2:-$(( $(left) - 10 ))}" python3 -m pytest -m gpu \
    "tests/exl3/test_gpu.py::test_24gib_budget_full_model[$mode]" -q -s -p no:cacheprovider -rfEs --tb=short \
    > "$OUT/$file" 2>&1
  echo "24 GiB $mode exit $?" | tee -a "$OUT/log"
  grep -E "\"24gib\"|passed|failed|^E " "$OUT/$file" | tail -8 | tee -a "$OUT/log"
}
# served_bench STEM TITLE [ARGS...]: `bench_rest` at 8K and 32K (4 rounds, cumulative checkpoints; ARGS such as
# --spec-only); puts each checkpoint's TTFT, begin() parts and rounds in the log.
served_bench() {
  local stem=$1 title=$2
  shift 2
  bench_rest "$stem" "$title" --checkpoints 8192,32768 --rounds 4 --warmup 1 --final-tokens 0 "$@"
  python3 - "$OUT/$stem.json" <<'PY' 2>&1 | tee -a "$OUT/log"
import json, sys
d = json.load(open(sys.argv[1]))
for name, s in d["systems"].items():
    for cp in s.get("checkpoints", []):
        sp = cp["spec"]
        print(name, cp["context"], "ttft", sp.get("ttft_seconds"), "begin", sp.get("prefill_seconds"),
              sp.get("prefill_parts"), "cached", sp.get("cached"), "rounds ms",
              [round(x * 1e3, 1) for x in sp.get("round_seconds", [])])
    for f in s.get("fresh_ttft", []):
        print(name, "fresh", f["context"], "ttft", f["seconds"])
PY
}
# full_model_ready: the build and the full-size synthetic checkpoints, unless this warm machine has them.
full_model_ready() {
  if [ ! -f /tmp/full/draft/config.json ]; then
    start_build_and_full_synth
    wait_build
    wait_synth
  fi
}
# group_probe LIMIT ARGS...: `prefill_group_probe.py` on /tmp/full for at most LIMIT s (ARGS: --groups,
# --prompts, --reps); its JSON lines in $OUT/probe.jsonl and the log.
group_probe() {
  local limit=$1
  shift
  echo "=== prefill group probe $* ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 3 "$limit" python3 elpis/bench/scripts/prefill_group_probe.py /tmp/full/target /tmp/full/draft "$@" \
    2>&1 | grep -E '^\{|Error|error' | tee "$OUT/probe.jsonl" | tee -a "$OUT/log"
}
# bench_rest STEM TITLE ARGS...: `elpis bench engine` of stock and elpis-tree16 on /tmp/full until 12 s before
# the call's limit (ARGS: --checkpoints and the like); $OUT/STEM.{json,md,txt}, its table rows in the log.
bench_rest() {
  local stem=$1 title=$2 b
  shift 2
  echo "=== bench engine, $stem ($(left) s left)" | tee -a "$OUT/log"
  b=$(( $(left) - 12 ))
  timeout -k 5 "$b" python3 -m elpis.cli bench engine --model /tmp/full/target --draft /tmp/full/draft \
    --systems stock,elpis-tree16 "$@" --time-limit $(( b - 10 )) --out-dir "$OUT" --stem "$stem" --title "$title" \
    > "$OUT/$stem.txt" 2>&1
  echo "bench: exit $?" | tee -a "$OUT/log"
  grep -E "^\| (stock|elpis)|^- (stock|elpis)" "$OUT/$stem.md" | tee -a "$OUT/log"
  rm -f "$OUT"/*.png
}
# ab NAME MARGIN SCRIPT ARGS...: one in-process A/B script (switch_ab.py, device_round_ab.py) on /tmp/full, stopped
# MARGIN s before the call's limit, its JSON and output as $OUT/NAME.{json,txt}; its result lines in the log
ab() {
  local name=$1 margin=$2 script=$3
  shift 3
  [ "$(left)" -gt $(( margin + 60 )) ] || { echo "$name: skipped ($(left) s left)" | tee -a "$OUT/log"; return; }
  echo "=== $name ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 5 $(( $(left) - margin )) python3 "elpis/bench/scripts/$script" /tmp/full/target /tmp/full/draft \
    --out "$OUT/$name.json" "$@" > "$OUT/$name.txt" 2>&1
  echo "$name: exit $?" | tee -a "$OUT/log"
  grep -E "^(SWITCHAB|SWITCHPROF|DEVROUNDAB|DEVROUNDPROF|ROUNDGRAPHAB|ROUNDGRAPHPROF) |Error|error" "$OUT/$name.txt" | tail -6 | cut -c1-1500 \
    | tee -a "$OUT/log"
}
