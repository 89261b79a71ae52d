#!/bin/bash
# Call 144 (session 36): why the round's decision kernel refuses every round on the GPU. Call 142 found status
# -6 ("internal") in test_round_tail.py's real-logits test and in every device-round test, while the CPU
# emulation of the same source passes.
# 1. round_tail_diag.py: the shipped kernel, a build whose internal refusals name their source line (at -O3 and
#    at -G), and the generated tree acceptor's raw poisoned runs on the GPU, against the CPU acceptor;
# 2. the device acceptor's GPU tests (the whole reference table on the GPU, tests/accept/test_device_acceptor.py);
# 3. compute-sanitizer's initcheck and memcheck over the failing test, if the time allows.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_once
echo "=== round tail diagnosis ($(left) s left)" | tee -a "$OUT/log"
timeout -k 3 150 python3 elpis/bench/scripts/round_tail_diag.py > "$OUT/round_tail_diag.txt" 2>&1
echo "diag: exit $?" | tee -a "$OUT/log"
head -c 6000 "$OUT/round_tail_diag.txt" | tee -a "$OUT/log"
part accept
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in initcheck memcheck; do
  [ -n "$SAN" ] && [ "$(left)" -gt 60 ] || break
  echo "=== compute-sanitizer $tool ($(left) s left)" | tee -a "$OUT/log"
  timeout -k 3 $(( $(left) - 20 )) "$SAN" --tool "$tool" --print-limit 20 python3 -m pytest -m gpu -q -x \
    -p no:cacheprovider "tests/kernels/test_round_tail.py::test_the_gpu_decides_as_the_proven_acceptor_from_real_logits" \
    > "$OUT/sanitizer-$tool.txt" 2>&1
  echo "$tool: exit $?" | tee -a "$OUT/log"
  grep -E "=========|passed|failed" "$OUT/sanitizer-$tool.txt" | head -30 | tee -a "$OUT/log"
done
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
