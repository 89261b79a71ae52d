"""The host's side of rounds on the GPU that needs no GPU: when the next round can be queued before the one in
flight is read back (`device_round.queue_reach`). Its graphs' keys are context buckets, so a round is queued
ahead only while every kvp it can start at falls in the same draft-block and verify buckets."""

from __future__ import annotations

import pytest

from elpis.backend import BackendError
from elpis.exl3.device_round import queue_reach
from elpis.exl3.tree_graph import MIN_BUCKET, bucket_pages

CACHE = 270_336
RUN, BLOCK = 16, 8


def reach(settled: int, in_flight: int, max_context: int = 262_144) -> int | None:
    return queue_reach(
        settled, in_flight, run=RUN, block=BLOCK, max_context=max_context,
        draft_width=lambda kvp: bucket_pages(kvp + 1 + BLOCK, CACHE),
        verify_width=lambda kvp: bucket_pages(kvp + RUN, CACHE),
    )  # fmt: skip


def test_with_nothing_in_flight_the_round_starts_where_the_host_is() -> None:
    assert reach(1000, 0) == 1000
    assert reach(MIN_BUCKET - RUN, 0) == MIN_BUCKET - RUN


def test_a_round_is_queued_ahead_inside_a_bucket_and_waits_at_its_edge() -> None:
    assert reach(1000, 1) == 1000 + BLOCK  # a round commits at most a draft block's rows
    verify_edge = MIN_BUCKET - RUN + 1  # the first kvp whose verify (kvp .. kvp + 15) needs the next bucket
    draft_edge = MIN_BUCKET - BLOCK  # the first kvp whose draft block (kvp .. kvp + 8) needs it
    assert reach(verify_edge - 1 - BLOCK, 1) == verify_edge - 1  # both ends in the first bucket
    assert reach(verify_edge - BLOCK, 1) is None  # the round ahead may verify in either bucket
    assert reach(verify_edge, 1) is None  # verifies in the next bucket, but its draft block may not
    assert reach(draft_edge, 1) == draft_edge + BLOCK  # both graphs in the next bucket at both ends
    assert reach(2 * MIN_BUCKET - RUN - BLOCK, 1) == 2 * MIN_BUCKET - RUN  # up to the next edge
    assert reach(2 * MIN_BUCKET - RUN - BLOCK + 1, 1) is None


def test_the_contexts_end_stops_queueing_ahead_and_refuses_a_round_past_it() -> None:
    top = 262_144
    assert reach(top - 1, 1, max_context=top) is None  # a round ahead could start past the context
    assert reach(top - 1, 0, max_context=top) == top - 1
    with pytest.raises(BackendError, match="runs past the context"):
        reach(top + RUN + 1, 0, max_context=top)
