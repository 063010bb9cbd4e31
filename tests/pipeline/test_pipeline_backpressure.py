"""max_in_flight: waiting in order, rejecting with Overloaded, queue bounds and timeouts."""
from __future__ import annotations

import asyncio
import time

import pytest
from helpers.pipeline import Gauge, Job, async_test, settle

from mimo.pipeline import Overloaded, Pipeline, PipelineError


class Held:
    """A stage function that holds each request until `release()`."""

    def __init__(self):
        self.gauge = Gauge()
        self.started: list[int] = []
        self.gate = asyncio.Event()

    async def __call__(self, req):
        with self.gauge:
            self.started.append(req.i)
            await self.gate.wait()
            return req.i


def _pipeline(held: Held, **kw) -> Pipeline:
    async def hold(req):
        return await held(req)
    return Pipeline([hold], **kw)


@async_test()
async def test_requests_over_the_bound_wait_in_arrival_order():
    held = Held()
    async with _pipeline(held, max_in_flight=2) as p:
        tasks = [asyncio.ensure_future(p.run(Job(i=i))) for i in range(6)]
        await settle()
        assert (p.in_flight, p.queued) == (2, 4) and held.started == [0, 1]
        held.gate.set()
        assert await asyncio.gather(*tasks) == list(range(6))
    assert held.gauge.max == 2 and held.started == list(range(6))
    assert (p.in_flight, p.queued) == (0, 0)


@async_test()
async def test_reject_at_once_when_full():
    held = Held()
    async with _pipeline(held, max_in_flight=2, max_queued=0) as p:
        running = [asyncio.ensure_future(p.run(Job(i=i))) for i in range(2)]
        await settle()
        t0 = time.monotonic()
        with pytest.raises(Overloaded) as ei:
            await p.run(Job(i=2))
        assert time.monotonic() - t0 < 0.5 and isinstance(ei.value, PipelineError)
        assert p.in_flight == 2
        held.gate.set()
        assert await asyncio.gather(*running) == [0, 1]
        assert await p.run(Job(i=3)) == 3     # room again


@async_test()
async def test_bounded_queue_and_queue_timeout():
    held = Held()
    async with _pipeline(held, max_in_flight=1, max_queued=1, queue_timeout=0.03) as p:
        first = asyncio.ensure_future(p.run(Job(i=0)))
        second = asyncio.ensure_future(p.run(Job(i=1)))
        await settle()
        assert (p.in_flight, p.queued) == (1, 1)
        with pytest.raises(Overloaded, match="waiting"):     # the queue is full
            await p.run(Job(i=2))
        t0 = time.monotonic()
        with pytest.raises(Overloaded, match="no slot within") as ei:
            await second                                      # waited too long
        assert time.monotonic() - t0 < 1.0 and ei.value.retry_after == 0.03
        assert (p.in_flight, p.queued) == (1, 0)
        held.gate.set()
        assert await first == 0
    assert held.started == [0]


@async_test()
async def test_slots_are_not_leaked_under_a_storm_of_cancellations():
    held = Held()
    async with _pipeline(held, max_in_flight=3) as p:
        reqs = [Job(i=i) for i in range(30)]
        tasks = [asyncio.ensure_future(p.run(r)) for r in reqs]
        await settle()
        for r in reqs[::2]:                 # half of them, some running, most queued
            r.cancel()
        await asyncio.sleep(0.001)
        held.gate.set()
        out = await asyncio.gather(*tasks, return_exceptions=True)
    done = [o for o in out if isinstance(o, int)]
    assert done == [i for i in range(30) if i % 2]
    assert held.gauge.max <= 3 and (p.in_flight, p.queued) == (0, 0)
