"""BatchStage: a stage that processes requests from many callers together, as one batch."""
from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import PipelineClosed, QueueFull, StageError
from .request import Request, StageTiming
from .stage import Stage, stage_errors

log = logging.getLogger("mimo.pipeline")


@dataclass(eq=False)
class _Item:
    req: Request
    fut: asyncio.Future[Any]
    cost: float
    enqueued: float                 # loop.time()
    started: float | None = None    # loop.time() when its batch began processing

    @property
    def live(self) -> bool:
        # A done future is a caller that went away (cancelled) or an item already answered.
        return not self.fut.done()


@dataclass(eq=False)
class _Wakeup:
    """A one-shot, task-free wakeup for the collector: set by submitters, awaited with an
    optional timeout (no wait_for, which would make a task per wait)."""
    waiter: asyncio.Future[None] | None = field(default=None)

    def set(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self, loop: asyncio.AbstractEventLoop, timeout: float | None) -> None:
        self.waiter = fut = loop.create_future()
        # The timer resolves (never cancels) the future, so a CancelledError here always
        # means our task was cancelled.
        timer = loop.call_later(timeout, _resolve, fut) if timeout is not None else None
        try:
            await fut
        finally:
            self.waiter = None
            if timer is not None:
                timer.cancel()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class BatchStage(Stage):
    """Collects requests from concurrent callers and processes them as one batch.

    Subclass and define `async def process_batch(self, reqs) -> list`, returning one entry
    per request, in order: its result, or an exception instance to fail that request alone
    (raising fails the whole batch). A result is what the caller's `run` returns; a stage
    usually stores it in the request's typed field before returning.

    A batch is cut when it holds `max_batch_size` requests, or when the next request's
    `cost(req)` would push its total past `max_batch_cost` (a request costlier than the
    whole budget runs alone rather than never), or `max_wait_ms` after its oldest request
    arrived, whichever comes first. Requests keep arrival order across batches.
    `max_concurrency` (default 1) bounds batches being processed at once; while all slots
    are busy, arrivals accumulate, so batches grow under load (adaptive batching).
    `max_queue` bounds waiting requests (beyond: `QueueFull`).

    Cancellation: a request cancelled while queued leaves the queue and is never in a
    batch; one cancelled while its batch runs does not stop the batch (the others need it)
    and its result is dropped. `process_batch` may skip work for `req.cancelled` requests.

    A background collector task starts on first use, on the running loop, and `close()`
    stops it, failing any queued requests with `PipelineClosed`. A closed BatchStage stays
    closed. Run blocking batch work in a thread (`await asyncio.to_thread(...)`).
    """
    max_batch_size: int = 32
    max_batch_cost: float | None = None
    max_wait_ms: float = 2.0
    max_queue: int | None = None
    max_concurrency: int | None = 1

    def cost(self, req: Request) -> float:
        """The request's share of `max_batch_cost` (e.g. its tokens). Default 1."""
        return 1.0

    async def process_batch(self, reqs: list[Request]) -> Sequence[Any]:
        raise NotImplementedError(f"{type(self).__name__} must define process_batch()")

    async def process(self, req: Request) -> Any:
        # A batch stage is driven through run(); this keeps the Stage contract complete.
        return (await self.process_batch([req]))[0]

    @property
    def queued(self) -> int:
        """Requests waiting for a batch (metrics)."""
        return len(self.__dict__.get("_queue", ()))

    # ---- callers ----------------------------------------------------------------------
    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        d = self.__dict__
        if d.get("_closed"):
            raise PipelineClosed("stage is closed", stage=self.name)
        if d.get("_loop") is loop:
            return
        if d.get("_loop") is not None:
            raise RuntimeError(f"BatchStage {self.name!r} is bound to another event loop; "
                               "make one per loop")
        if self.max_batch_size < 1 or (self.max_batch_cost is not None
                                       and self.max_batch_cost <= 0):
            raise ValueError(f"stage {self.name!r}: batch size and cost budgets must be > 0")
        self._loop = loop
        self._queue: collections.deque[_Item] = collections.deque()
        self._wakeup = _Wakeup()
        self._batches: set[asyncio.Task[Any]] = set()
        self._collector = loop.create_task(self._collect(), name=f"{self.name}-collector")
        self._collector.add_done_callback(self._collector_done)

    def _collector_done(self, task: asyncio.Task[Any]) -> None:
        # Only close() should end the collector. If a bug ends it, fail the queued requests
        # and every later one, rather than leave callers waiting forever.
        if task.cancelled() or task.exception() is None:
            return
        err = task.exception()
        assert err is not None
        log.error("BatchStage %r collector failed", self.name, exc_info=err)
        self._closed = True
        while self._queue:
            _fail(self._queue.popleft().fut, StageError(self.name, err))

    async def run(self, req: Request) -> Any:
        self._start()
        if self.max_queue is not None and len(self._queue) >= self.max_queue:
            raise QueueFull(f"{len(self._queue)} requests queued", stage=self.name)
        with stage_errors(self.name):
            cost = float(self.cost(req))
        loop = self._loop
        item = _Item(req, loop.create_future(), cost, loop.time())
        self._queue.append(item)
        self._wakeup.set()
        req.stage = self.name
        try:
            with stage_errors(self.name):
                try:
                    result = await item.fut
                except asyncio.CancelledError:
                    # Invariant: a cancelled caller's item is never handed to process_batch.
                    # If it is still queued, take it out now; if its batch already runs, its
                    # answer is dropped (its future is cancelled, so the batch skips it).
                    try:
                        self._queue.remove(item)
                    except ValueError:
                        pass
                    raise
        finally:
            req.stage = None
            now = loop.time()
            start = item.started if item.started is not None else now
            req.timings[self.name] = StageTiming(start - item.enqueued, now - start)
        return result

    # ---- the collector ------------------------------------------------------------------
    def _take(self) -> list[_Item]:
        """Pop the next batch off the queue head, honouring size and cost budgets."""
        batch: list[_Item] = []
        total = 0.0
        q = self._queue
        while q and len(batch) < self.max_batch_size:
            it = q[0]
            if not it.live:
                q.popleft()
                continue
            if (self.max_batch_cost is not None and batch
                    and total + it.cost > self.max_batch_cost):
                break
            q.popleft()
            batch.append(it)
            total += it.cost
        return batch

    def _full(self) -> bool:
        """Would a batch cut now be as large as a budget allows?"""
        n, total = 0, 0.0
        for it in self._queue:
            if not it.live:
                continue
            if n >= self.max_batch_size:
                return True
            if self.max_batch_cost is not None and n and total + it.cost > self.max_batch_cost:
                return True
            n += 1
            total += it.cost
        return n >= self.max_batch_size or (self.max_batch_cost is not None
                                            and total >= self.max_batch_cost)

    async def _collect(self) -> None:
        loop = self._loop
        slots = self._slots()
        while True:
            if slots is not None:
                await slots.acquire()   # all slots busy: arrivals accumulate meanwhile
            try:
                batch: list[_Item] = []
                while not batch:
                    while not any(it.live for it in self._queue):
                        self._queue.clear()
                        await self._wakeup.wait(loop, None)
                    oldest = next(it for it in self._queue if it.live)
                    deadline = oldest.enqueued + self.max_wait_ms / 1000.0
                    while not self._full() and (left := deadline - loop.time()) > 0:
                        await self._wakeup.wait(loop, left)
                    batch = self._take()   # empty if every item was cancelled meanwhile
                task = loop.create_task(self._run_batch(batch, slots),
                                        name=f"{self.name}-batch")
            except BaseException:
                if slots is not None:
                    slots.release()
                raise
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)

    async def _run_batch(self, batch: list[_Item], slots: asyncio.Semaphore | None) -> None:
        try:
            live = [it for it in batch if it.live]
            if not live:
                return
            now = self._loop.time()
            for it in live:
                it.started = now
            try:
                results = await self.process_batch([it.req for it in live])
                if results is None or len(results) != len(live):
                    got = "None" if results is None else f"{len(results)} results"
                    raise TypeError(f"process_batch returned {got} for {len(live)} requests")
            except asyncio.CancelledError:
                for it in live:
                    _fail(it.fut, PipelineClosed("stage closed mid-batch", stage=self.name))
                raise
            except Exception as e:
                for it in live:
                    _fail(it.fut, e)
                return
            for it, r in zip(live, results):
                if isinstance(r, BaseException):
                    _fail(it.fut, r)
                elif not it.fut.done():
                    it.fut.set_result(r)
        finally:
            if slots is not None:
                slots.release()

    async def close(self) -> None:
        """Stop the collector and any running batches; queued callers get PipelineClosed.
        Idempotent."""
        self._closed = True
        if self.__dict__.get("_loop") is None:
            return
        tasks = [self._collector, *self._batches]
        for t in tasks:
            t.cancel()
        while self._queue:
            _fail(self._queue.popleft().fut, PipelineClosed("stage closed", stage=self.name))
        await asyncio.gather(*tasks, return_exceptions=True)


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if fut.done():
        return
    if not isinstance(exc, Exception) or isinstance(exc, StopIteration):
        # Futures refuse StopIteration, and a BaseException (e.g. CancelledError) returned
        # as a result must not cancel or kill the caller: report it as a bug in the stage.
        exc = RuntimeError(f"batch result was {exc!r}")
    fut.set_exception(exc)
