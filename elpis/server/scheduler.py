"""One sequence at a time: a bounded FIFO of jobs, run one by one on a single engine thread.

The event loop never blocks on the engine: a job's blocking iterator runs on the engine thread and hands
each item to the loop. A job is cancelled when its client goes away: a queued job is dropped, the running
job sees `should_stop()` turn true and ends at its next round (the generator finishes the sequence, so the
backend state stays consistent). Any exception from the engine is fatal: the scheduler records it, and
from then on every job is refused with 503 until the process restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from elpis.server.errors import APIError

log = logging.getLogger("elpis.server")

ShouldStop = Callable[[], bool]
JobBody = Callable[[ShouldStop], Iterator[Any]]


@dataclass(frozen=True)
class JobEnd:
    """Last item of every job: None when it ran to the end, else the error to answer with."""

    error: APIError | None = None


class QueueFull(APIError):
    def __init__(self, retry_after: int) -> None:
        super().__init__(
            429,
            "the server is busy: the request queue is full; retry later",
            code="queue_full",
            headers={"Retry-After": str(retry_after)},
        )


def unavailable(reason: str, code: str) -> APIError:
    return APIError(503, reason, code=code)


@dataclass(eq=False)
class Job:
    body: JobBody
    outbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    stop: threading.Event = field(default_factory=threading.Event)
    state: str = "queued"  # queued -> running -> done
    queued_at: float = field(default_factory=time.monotonic)

    async def next(self, timeout: float | None = None) -> Any:
        """The next item; raises TimeoutError when nothing came within `timeout` seconds."""
        return await asyncio.wait_for(self.outbox.get(), timeout)


class Scheduler:
    def __init__(self, max_queue: int) -> None:
        if max_queue < 1:
            raise ValueError("max_queue must be >= 1")
        self.max_queue = max_queue
        self._waiting: deque[Job] = deque()
        self._wakeup = asyncio.Event()
        self._engine = ThreadPoolExecutor(max_workers=1, thread_name_prefix="elpis-engine")
        self._worker: asyncio.Task[None] | None = None
        self._running_future: asyncio.Future[None] | None = None
        self._recent_seconds: deque[float] = deque(maxlen=16)
        self.running: Job | None = None
        self.failure: str | None = None
        self.shutting_down = False
        self.completed = 0

    # ------------------------------------------------------------------------------------------- state

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    @property
    def healthy(self) -> bool:
        return self.failure is None and not self.shutting_down

    def start(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._serve(), name="elpis-scheduler")

    def fail(self, reason: str) -> None:
        """Mark the engine as broken: nothing runs any more and /health answers 503."""
        if self.failure is None:
            self.failure = reason
            log.error("[serve] engine failed; the server needs a restart: %s", reason)
        while self._waiting:
            self._finish(self._waiting.popleft(), self._refusal())

    def _refusal(self) -> APIError:
        if self.failure is not None:
            return unavailable("the engine failed and the server needs a restart", "generation_failed")
        return unavailable("the server is shutting down", "server_shutting_down")

    # ------------------------------------------------------------------------------------------ submit

    def submit(self, body: JobBody, stop: threading.Event | None = None) -> Job:
        """Queue `body` (called on the engine thread with `should_stop`); `stop` is its cancel flag."""
        if not self.healthy:
            raise self._refusal()
        if len(self._waiting) >= self.max_queue:
            raise QueueFull(self._retry_after())
        job = Job(body, stop=stop or threading.Event())
        self._waiting.append(job)
        self._wakeup.set()
        return job

    def _retry_after(self) -> int:
        per_job = sum(self._recent_seconds) / len(self._recent_seconds) if self._recent_seconds else 1.0
        return max(1, min(600, math.ceil(per_job * (len(self._waiting) + 1))))

    def cancel(self, job: Job) -> None:
        """The client is gone: drop the job if it waits, stop it at the next round if it runs."""
        if job.state == "queued":
            with contextlib.suppress(ValueError):
                self._waiting.remove(job)
            job.state = "done"
        elif job.state == "running":
            job.stop.set()

    # -------------------------------------------------------------------------------------------- run

    def _finish(self, job: Job, error: APIError | None) -> None:
        job.state = "done"
        job.outbox.put_nowait(JobEnd(error))

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
            job = self._waiting.popleft()
            if not self.healthy:
                self._finish(job, self._refusal())
                continue
            self.running, job.state = job, "running"
            started = time.monotonic()
            self._running_future = loop.run_in_executor(self._engine, self._run_on_engine, job, loop)
            future = self._running_future
            try:
                error = await asyncio.shield(future)
            except asyncio.CancelledError:  # shutdown: the job still gets its last item
                done = future.done() and not future.cancelled()
                self._finish(job, future.result() if done else self._refusal())
                raise
            finally:
                self.running = None
                self._running_future = None
            self._recent_seconds.append(time.monotonic() - started)
            self.completed += 1
            self._finish(job, error)

    def _run_on_engine(self, job: Job, loop: asyncio.AbstractEventLoop) -> APIError | None:
        try:
            for item in job.body(job.stop.is_set):
                loop.call_soon_threadsafe(job.outbox.put_nowait, item)
        except Exception as exc:  # any engine failure is fatal (see the module docstring)
            reason = f"{type(exc).__name__}: {exc}"
            loop.call_soon_threadsafe(self.fail, reason)
            return unavailable("the engine failed and the server needs a restart", "generation_failed")
        return None

    # --------------------------------------------------------------------------------------- shutdown

    async def shutdown(self, grace_s: float, cancel_wait_s: float = 30.0) -> bool:
        """Refuse new work, fail queued jobs, let the running job finish for `grace_s`, then cancel it.

        Returns True when the engine thread is idle at the end (False: it did not stop in time).
        """
        self.shutting_down = True
        while self._waiting:
            self._finish(self._waiting.popleft(), self._refusal())
        running, future = self.running, self._running_future
        idle = True
        if future is not None and running is not None:
            try:
                await asyncio.wait_for(asyncio.shield(future), grace_s)
            except TimeoutError:
                log.info("[serve] shutdown: cancelling the running request")
                running.stop.set()
                try:
                    await asyncio.wait_for(asyncio.shield(future), cancel_wait_s)
                except TimeoutError:
                    idle = False
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        self._engine.shutdown(wait=idle, cancel_futures=True)
        return idle
