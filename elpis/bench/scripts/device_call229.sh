#!/bin/bash
# Call 229 (session 59; chained onto call 228's warm machine, LIMIT ~300): the 24 GiB test at 262,000 tokens with
# the served generator's rounds on the GPU, now followed by a sampled top_p request asking for logprobs from the
# prefix cache: its rounds on the GPU through the vocab draw's nucleus (the random model's flat rows), and the
# logprobs' record buffers (15.9 MB, made at the first such request; session 58 left them out of this test).
# The test turns exl3-vocab-draw-nucleus (off by default) on for that mode.
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-300}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
gpu_line
full_model_ready
gib24_test "device rounds, then a sampled logprobs request" $(( LIMIT - 20 )) tree-16-device-rounds
pack_outputs
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
