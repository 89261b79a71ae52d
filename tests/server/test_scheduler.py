"""The job queue: FIFO on one engine thread, bounded, cancellable, fatal on engine errors, quick shutdown."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from elpis.backend import BackendError
from elpis.server.errors import APIError
from elpis.server.scheduler import JobEnd, QueueFull, Scheduler


def counting_body(log: list, name: str, steps: int = 3, delay: float = 0.0):
    def body(should_stop):
        log.append((name, threading.current_thread().name))
        for i in range(steps):
            if should_stop():
                yield "stopped"
                return
            time.sleep(delay)
            yield f"{name}{i}"

    return body


async def drain(job) -> list:
    items = []
    while True:
        item = await job.next(5)
        if isinstance(item, JobEnd):
            return [*items, item]
        items.append(item)


async def test_jobs_run_in_order_on_one_engine_thread() -> None:
    scheduler = Scheduler(max_queue=8)
    scheduler.start()
    log: list = []
    jobs = [scheduler.submit(counting_body(log, name)) for name in "abc"]
    results = [await drain(job) for job in jobs]
    assert [r[:-1] for r in results] == [["a0", "a1", "a2"], ["b0", "b1", "b2"], ["c0", "c1", "c2"]]
    assert all(r[-1] == JobEnd(None) for r in results)
    assert [name for name, _ in log] == ["a", "b", "c"]
    assert len({thread for _, thread in log}) == 1 and log[0][1].startswith("elpis-engine")
    assert await scheduler.shutdown(1.0)


async def test_full_queue_answers_429_with_retry_after() -> None:
    scheduler = Scheduler(max_queue=2)  # not started: nothing leaves the queue
    scheduler.submit(counting_body([], "a"))
    scheduler.submit(counting_body([], "b"))
    with pytest.raises(QueueFull) as info:
        scheduler.submit(counting_body([], "c"))
    assert info.value.status == 429 and int(info.value.headers["Retry-After"]) >= 1


async def test_cancel_drops_queued_and_stops_running_jobs() -> None:
    scheduler = Scheduler(max_queue=8)
    scheduler.start()
    log: list = []
    running = scheduler.submit(counting_body(log, "r", steps=200, delay=0.01))
    queued = scheduler.submit(counting_body(log, "q"))
    assert await running.next(5) == "r0"
    scheduler.cancel(queued)
    assert scheduler.queue_depth == 0
    scheduler.cancel(running)
    items = await drain(running)
    assert items[-2:] == ["stopped", JobEnd(None)] and len(items) < 50
    after = scheduler.submit(counting_body(log, "n"))
    assert (await drain(after))[:-1] == ["n0", "n1", "n2"]
    assert [name for name, _ in log] == ["r", "n"]  # the cancelled queued job never ran
    assert await scheduler.shutdown(1.0)


async def test_engine_error_is_fatal_and_sticky() -> None:
    scheduler = Scheduler(max_queue=8)
    scheduler.start()

    def broken(should_stop):
        yield "partial"
        raise BackendError("device lost")

    job = scheduler.submit(broken)
    waiting = scheduler.submit(counting_body([], "w"))
    items = await drain(job)
    assert items[0] == "partial" and items[-1].error.status == 503
    assert items[-1].error.code == "generation_failed"
    assert (await drain(waiting))[-1].error.code == "generation_failed"
    assert not scheduler.healthy and "device lost" in scheduler.failure
    with pytest.raises(APIError) as info:
        scheduler.submit(counting_body([], "late"))
    assert info.value.status == 503
    await scheduler.shutdown(1.0)


async def test_shutdown_lets_the_running_job_finish_or_cancels_it() -> None:
    scheduler = Scheduler(max_queue=8)
    scheduler.start()
    quick = scheduler.submit(counting_body([], "q", steps=3, delay=0.05))
    queued = scheduler.submit(counting_body([], "x"))
    await quick.next(5)
    start = time.monotonic()
    assert await scheduler.shutdown(grace_s=5.0)
    assert time.monotonic() - start < 2
    assert (await drain(quick))[-1] == JobEnd(None)  # finished within the grace period
    assert (await drain(queued))[-1].error.code == "server_shutting_down"

    scheduler = Scheduler(max_queue=8)
    scheduler.start()
    slow = scheduler.submit(counting_body([], "s", steps=10_000, delay=0.01))
    await slow.next(5)
    start = time.monotonic()
    assert await scheduler.shutdown(grace_s=0.2)
    assert time.monotonic() - start < 2
    assert "stopped" in await drain(slow)  # cancelled at its next step
    with pytest.raises(APIError):
        scheduler.submit(counting_body([], "late"))


async def test_event_loop_stays_responsive_while_the_engine_works() -> None:
    scheduler = Scheduler(max_queue=8)
    scheduler.start()
    job = scheduler.submit(counting_body([], "busy", steps=20, delay=0.02))
    ticks = 0
    while job.state != "done":
        await asyncio.sleep(0.005)
        ticks += 1
    assert ticks > 5  # a loop blocked by the engine would tick once or not at all
    await scheduler.shutdown(1.0)
