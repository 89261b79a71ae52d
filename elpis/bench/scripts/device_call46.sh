#!/bin/bash
# Call 46 (issue 9, session 12): call 45's model gate part alone, on the machine call 45 left warm (its build,
# /tmp/small and /tmp/small-deq), with the registry patch switched on. Run with run(carry=[".whl", ".device"]).
source elpis/bench/scripts/device_common.sh
rows_gemm_model_gate rows-gemm-grouped-code-small
ls -la "$OUT/gate"
