#!/bin/bash
# Call 147 (staged in session 37). Calls 142-146 found the round's decision (round_tail.cu) refusing every round
# on the H200: nvcc 13.0 compiled gdn_tree_plan.cuh's checks, in the tail, into a refusal of row 0 of every chain.
# Session 37 reproduced it without a GPU (tests/kernels/ptx_interp.py runs nvcc's PTX; the header's note says
# what changed), and tests/kernels/test_round_kernels_ptx.py now checks the tail's and the plan's PTX in CI.
# This call runs call 142's GPU tests on the fixed header: the round plan and tail kernels against the host (and
# the load-time checks of both, and of the rows GEMM's decode, on the GPU), the zero commit plan, greedy rounds on the GPU end to end on the small model (tests/exl3/test_device_round.py), and
# the draft's padded conditioning; the full-size checkpoints are made beside them for call 143 (the host vs
# device rounds A/B) chained onto this warm machine. Session 38 added the gate projections kernel's GPU tests: its
# spans, chunks and butterfly now come from the proved schedule header (bit for bit under emulation, the same PTX op
# sequence), and the GPU's bits against cuBLAS and its row invariance are test_gdn_ba.py's to confirm; and the
# verify epilogue (each row's greedy target and row check in one launch, now in the device rounds' path) against
# torch's composition on the GPU. Session 39 added the draft candidates kernel's GPU tests (fp64 bound, torch's ids,
# a timing line beside torch's composition).
# Run with run(carry=[".whl", ".device"]) and ELPIS_GIT_REVISION set.
LIMIT=${LIMIT:-590}
T0=$(date +%s)
source elpis/bench/scripts/device_common.sh
build_and_small_synth
start_full_synth
nvcc --version 2>&1 | tail -2 | tee -a "$OUT/log"
gpu_pytest "round plan and tail kernels, zero commit plan, load-time checks" 150 tests/kernels/test_round_plan.py \
  tests/kernels/test_round_tail.py "tests/kernels/test_gdn_tree.py::test_a_zero_plan_commits_nothing" \
  "tests/kernels/test_rows_gemm.py::test_the_served_build_passes_the_decode_check_load_backend_makes" \
  tests/kernels/test_gdn_ba.py tests/kernels/test_verify_epilogue.py tests/kernels/test_draft_candidates.py
ELPIS_SMALL_DIR=/tmp/small gpu_pytest "greedy rounds on the GPU, small model" $(( $(left) - 20 )) \
  tests/exl3/test_device_round.py "tests/exl3/test_draft_graph.py::test_padded_conditioning_keeps_the_committed_rows_bits"
finish_full_synth
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log"
