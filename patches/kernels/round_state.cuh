// What the round's kernels on the GPU share (round_plan.cu before the verify, round_tail.cu after it): the
// request's state block in device memory, which the tail advances after each committed round and the plan
// reads at the next, so one captured graph serves every round (elpis.exl3.round_plan.STATE_*).
#ifndef ELPIS_ROUND_STATE_CUH
#define ELPIS_ROUND_STATE_CUH

#include <stdint.h>

#include "accept_device.cuh"

// int64 words: the anchor (the last committed token, not yet in the cache), kvp (committed positions), the
// tokens the request may still generate, the context's size, the tree's row budget, whether the request has
// ended (a stop token or the budget), its stop ids, then the request's epoch (set by the host, unique in its
// process) and the number of rounds the tail has decided for it: the tail stamps both on its record, so the
// host can tell a record that is not the round it waits for (lost, repeated, or another request's).
constexpr int kStAnchor = 0, kStKvp = 1, kStRemaining = 2, kStMaxContext = 3, kStTreeBudget = 4, kStDone = 5,
              kStNStops = 6, kStStops = 7;
constexpr int kStEpoch = kStStops + ELPIS_MAX_STOPS, kStRound = kStEpoch + 1;
constexpr int kStateWords = kStRound + 1;

constexpr int kPlanCapacity = 256;  // bytes of a packed Gated DeltaNet plan input (gdn_tree.PLAN_CAPACITY)
constexpr int64_t kPage = 256;      // positions per cache page (tree_verify.PAGE)

#endif
