"""Admission: the pipeline's in-flight bound (backpressure)."""
from __future__ import annotations

import asyncio
import collections

from .errors import Overloaded

_GRANTED, _TIMED_OUT = True, False


class Admission:
    """At most `limit` holders at once (None: unbounded). Others wait in arrival order; at
    most `max_queued` may wait (None: any number; 0: never wait, reject at once) and each
    for at most `timeout` seconds (None: no limit). Past either bound: `Overloaded`.

    Invariant: `in_flight` counts exactly the acquires not yet released. A slot freed while
    someone waits passes straight to the oldest waiter (in_flight unchanged), so a newcomer
    can never overtake the queue.
    """

    def __init__(self, limit: int | None = None, max_queued: int | None = None,
                 timeout: float | None = None):
        if limit is not None and limit < 1:
            raise ValueError("max_in_flight must be >= 1 (or None for no bound)")
        if max_queued is not None and max_queued < 0:
            raise ValueError("max_queued must be >= 0 (or None for no bound)")
        self.limit = limit
        self.max_queued = max_queued
        self.timeout = timeout
        self.in_flight = 0
        self._waiters: collections.deque[asyncio.Future[object]] = collections.deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        if self.limit is None or (self.in_flight < self.limit and not self._waiters):
            self.in_flight += 1
            return
        if self.max_queued is not None and len(self._waiters) >= self.max_queued:
            raise Overloaded(f"{self.in_flight} requests in flight, {len(self._waiters)} "
                             "waiting")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._waiters.append(fut)
        timer = (loop.call_later(self.timeout, self._expire, fut)
                 if self.timeout is not None else None)
        try:
            granted = await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.result() is _GRANTED:
                self.release()   # handed a slot just as we were cancelled: pass it on
            else:
                self._discard(fut)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if granted is _TIMED_OUT:
            raise Overloaded(f"no slot within {self.timeout}s ({self.in_flight} in flight)",
                             retry_after=self.timeout)

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(_GRANTED)
                return
        self.in_flight -= 1
        assert self.in_flight >= 0, "Admission released more often than acquired"

    def _expire(self, fut: asyncio.Future[object]) -> None:
        if not fut.done():
            self._discard(fut)
            fut.set_result(_TIMED_OUT)

    def _discard(self, fut: asyncio.Future[object]) -> None:
        try:
            self._waiters.remove(fut)
        except ValueError:
            pass
