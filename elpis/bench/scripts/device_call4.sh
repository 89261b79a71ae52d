#!/bin/bash
# Call 4: build the proven acceptor on the GPU machine (its own Python), then the GPU tests, including the
# product path (speculation core + compiled acceptor + exl3 backend) on the small synthetic model.
LIMIT=${LIMIT:-280}
source elpis/bench/scripts/device_common.sh
( time python3 -m elpis.cli build ) 2>&1 | tail -6 | tee -a "$OUT/log"
python3 -m elpis.cli synth --small /tmp/small 2>&1 | tail -1
ELPIS_SMALL_DIR=/tmp/small timeout $(( $(left) - 8 )) python3 -m pytest -m gpu tests/exl3 tests/spec -q -p no:cacheprovider \
  -k "not 24gib" -rs 2>&1 | tail -30 | tee -a "$OUT/log"
