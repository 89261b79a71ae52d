#!/bin/bash
# Call 70a (session 17, the last 259 s of its device time): the disk tier across a restart only (it now
# settles background snapshot copies before persisting), with whatever time is left after the build.
LIMIT=${LIMIT:-175}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "disk tier across a restart" $(( $(left) - 5 )) \
  "tests/exl3/test_gpu.py::test_restart_reuses_disk_prefix"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
