"""The host's side of rounds on the GPU that needs no GPU: when the next round can be queued before the one
in flight is read back (`device_round.queue_reach`; its graphs' keys are context buckets, so a round is
queued ahead only while every kvp it can start at falls in the same draft-block and verify buckets), and how
a round's records are checked on arrival and fetched again when they are not that round's (`record_fault`,
`checked_records`, with `RecordFaults` injecting what could go wrong on the way back). The same code runs
on the GPU in tests/exl3/test_device_round.py."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from elpis.backend import BackendError
from elpis.exl3 import device_round as dr
from elpis.exl3.device_round import RecordFaults, checked_records, queue_reach, record_fault
from elpis.exl3.tree_graph import MIN_BUCKET, bucket_pages
from elpis.spec.faults import CORRUPT, DROPPED, REPEATED, STALE, STALE_COMMIT

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


def records(epoch: int, number: int, seed: int = 0) -> list[int]:
    """A round's two records as the kernels write them: arbitrary words, stamped with epoch and number."""
    words = [random.Random(f"{epoch}/{number}/{seed}").randrange(-5, 300) for _ in range(dr.RECORD_WORDS)]
    words[dr.EPOCH_WORD], words[dr.ROUND_WORD] = epoch, number
    return words


def test_a_record_is_recognised_as_its_round_or_named_as_what_it_is() -> None:
    assert record_fault(records(7, 3), 7, 3) is None
    assert record_fault(records(7, 2), 7, 3) == REPEATED
    assert record_fault(records(6, 3), 7, 3) == STALE  # another request's, whatever its number
    arrived_never = records(7, 1)
    arrived_never[dr.ROUND_WORD] = dr.NOT_ARRIVED
    assert record_fault(arrived_never, 7, 3) == DROPPED
    with pytest.raises(BackendError, match="not yet queued"):
        record_fault(records(7, 4), 7, 3)
    with pytest.raises(ValueError, match="words"):
        record_fault(records(7, 3)[:-1], 7, 3)


def test_faults_on_the_way_back_are_detected_and_the_round_read_again_from_its_slot() -> None:
    """Rounds of two requests through the ring of record slots as DeviceRounds runs them (the host slot marked
    before each copy, the copy, the injected damage, the check): every injected fault is detected once, the
    records read are always the round's own, and rounds without a fault are read once."""
    schedule = {1: DROPPED, 2: REPEATED, 4: STALE, 5: DROPPED, 7: REPEATED}
    faults = RecordFaults(schedule)
    device = torch.zeros((dr.IN_FLIGHT, dr.RECORD_WORDS), dtype=torch.int32)
    host = torch.zeros((dr.IN_FLIGHT, dr.RECORD_WORDS), dtype=torch.int32)
    detected: Counter[str] = Counter()
    last = other = None
    for epoch in (11, 12):
        if last is not None:
            other = last
        last = None
        for number in range(9):
            slot = number % dr.IN_FLIGHT
            device[slot] = torch.tensor(records(epoch, number))  # what the tail wrote on the device
            host[slot, dr.ROUND_WORD] = dr.NOT_ARRIVED
            before = host[slot].tolist()
            host[slot].copy_(device[slot])  # the copy back
            faults.damage(number, host[slot], before, last, other)
            words, recovered = checked_records(host[slot], device[slot], epoch, number)
            assert words == records(epoch, number)
            detected.update(recovered)
            injected = number in schedule and (epoch, schedule[number]) != (11, STALE)
            assert recovered == ((schedule[number],) if injected else ())
            last = words
    # the first request has no earlier request to replay: its stale fault is not injected
    assert faults.injected == detected == Counter({DROPPED: 4, REPEATED: 4, STALE: 1})


def test_records_wrong_again_from_the_device_fail_the_round() -> None:
    host = torch.tensor(records(3, 0), dtype=torch.int32)
    device = torch.tensor(records(2, 0), dtype=torch.int32)  # the device slot is another request's too
    with pytest.raises(BackendError, match="arrived stale, and read from the device: stale"):
        checked_records(host, device, 4, 0)


@pytest.mark.parametrize(("schedule", "message"), [
    ({3: CORRUPT}, "row checks"), ({3: STALE_COMMIT}, "stream order"), ({0: REPEATED}, "not at round 0"),
])  # fmt: skip
def test_record_faults_refuse_what_cannot_happen_on_the_way_back(schedule, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RecordFaults(schedule)
