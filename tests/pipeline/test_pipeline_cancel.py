"""Cancellation reaches every stage, frees every slot and skips later stages; deadlines;
close()."""
from __future__ import annotations

import asyncio
import time

import pytest
from helpers.pipeline import async_test, settle

from mimo.pipeline import (
    DeadlineExceeded,
    Pipeline,
    PipelineClosed,
    Request,
    RequestCancelled,
    Stage,
)


class Block(Stage):
    """Waits on a gate; records entries and cleanups (its `finally`)."""
    max_concurrency = 1

    def __init__(self, name="block"):
        super().__init__(name)
        self.gate = asyncio.Event()
        self.entered: list[str] = []
        self.cleaned: list[str] = []

    async def process(self, req):
        self.entered.append(req.id)
        try:
            await self.gate.wait()
            return "done"
        finally:
            self.cleaned.append(req.id)


class Mark(Stage):
    def __init__(self):
        super().__init__("mark")
        self.seen: list[str] = []

    async def process(self, req):
        self.seen.append(req.id)


async def _until(cond, timeout=2.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "condition never became true"
        await asyncio.sleep(0.001)


@async_test()
async def test_cancel_mid_stage_frees_its_slot_and_skips_later_stages():
    block, mark = Block(), Mark()
    async with Pipeline([block, mark], max_in_flight=1) as p:
        r = Request()
        t = asyncio.ensure_future(p.run(r))
        await _until(lambda: block.entered)
        assert r.stage == "block" and p.in_flight == 1
        assert r.cancel("client went away")
        with pytest.raises(RequestCancelled) as ei:
            await t
        assert ei.value.reason == "client went away" and ei.value.stage == "block"
        assert block.cleaned == [r.id]          # the stage's finally ran before run() raised
        assert mark.seen == []                  # no later stage
        assert p.in_flight == 0 and r.cancelled and not r.running
        # both the pipeline slot and the stage's single slot are free again
        block.gate.set()
        r2 = Request()
        assert await p.run(r2) is None and mark.seen == [r2.id]


@async_test()
async def test_cancelling_the_callers_task_propagates_into_the_stage():
    block, mark = Block(), Mark()
    async with Pipeline([block, mark]) as p:
        r = Request()
        caller = asyncio.ensure_future(p.run(r))
        await _until(lambda: block.entered)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):   # the caller's own cancellation stays
            await caller
        assert block.cleaned == [r.id] and mark.seen == [] and p.in_flight == 0
        assert r.cancel_error.reason == "caller cancelled"

        # and asyncio.timeout / wait_for around run() behave as usual
        r2 = Request()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(p.run(r2), 0.01)
        assert block.cleaned == [r.id, r2.id] and p.in_flight == 0


@async_test()
async def test_cancel_while_waiting_for_a_stage_slot_or_a_pipeline_slot():
    block = Block()
    async with Pipeline([block], max_in_flight=2) as p:
        a, b, c = Request(), Request(), Request()
        ta, tb, tc = (asyncio.ensure_future(p.run(x)) for x in (a, b, c))
        await _until(lambda: block.entered)
        await settle()
        assert (p.in_flight, p.queued) == (2, 1)   # a in the stage, b at its semaphore, c queued
        b.cancel()
        c.cancel()
        for t in (tb, tc):
            with pytest.raises(RequestCancelled):
                await t
        assert (p.in_flight, p.queued) == (1, 0)
        assert block.entered == [a.id]             # b never entered
        block.gate.set()
        assert await ta == "done"


@async_test()
async def test_deadline_cancels_wherever_the_request_is():
    block, mark = Block(), Mark()
    async with Pipeline([block, mark]) as p:
        r = Request.with_timeout(0.03)
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded) as ei:
            await p.run(r)
        assert 0.02 < time.monotonic() - t0 < 1.0
        assert isinstance(ei.value, RequestCancelled) and ei.value.stage == "block"
        assert block.cleaned == [r.id] and mark.seen == []
        # already past its deadline: fails without entering any stage
        late = Request(deadline=time.monotonic() - 1)
        with pytest.raises(DeadlineExceeded):
            await p.run(late)
        assert block.entered == [r.id]
        # a deadline that does not pass changes nothing
        block.gate.set()
        assert await p.run(Request.with_timeout(5)) is None


@async_test()
async def test_a_stage_that_swallows_cancellation_still_stops_the_request():
    mark = Mark()

    async def stubborn(req):
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "ignored the cancel"     # bad manners; the pipeline stops anyway

    async def raises_instead(req):
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    for first in (stubborn, raises_instead):
        async with Pipeline([first, mark]) as p:
            r = Request()
            t = asyncio.ensure_future(p.run(r))
            await settle()
            r.cancel("stop")
            with pytest.raises(RequestCancelled, match="stop"):
                await t
    assert mark.seen == []


@async_test()
async def test_close_cancels_in_flight_requests_or_lets_them_finish():
    block = Block()
    p = Pipeline([block], max_in_flight=1)
    t1 = asyncio.ensure_future(p.run(Request()))
    t2 = asyncio.ensure_future(p.run(Request()))     # waits for a slot
    await _until(lambda: block.entered)
    await p.close()
    for t in (t1, t2):
        with pytest.raises(PipelineClosed):
            await t
    with pytest.raises(PipelineClosed):
        await p.run(Request())
    await p.close()                                  # idempotent

    # graceful: requests that finish within the timeout succeed
    block2 = Block()
    p2 = Pipeline([block2])
    t3 = asyncio.ensure_future(p2.run(Request()))
    await _until(lambda: block2.entered)
    asyncio.get_running_loop().call_later(0.01, block2.gate.set)
    await p2.close(timeout=2.0)
    assert await t3 == "done"
