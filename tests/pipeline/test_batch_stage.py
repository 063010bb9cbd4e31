"""BatchStage: grouping by size and cost, flushing, per-item results and errors, queue."""
from __future__ import annotations

import asyncio
import time

import pytest
from helpers.pipeline import Job, async_test, settle

from mimo.pipeline import (
    BatchStage,
    Pipeline,
    PipelineClosed,
    QueueFull,
    RequestCancelled,
    StageError,
)


class Square(BatchStage):
    """Squares req.x per item into req.out["square"] (and returns it); records each batch's
    xs. x < 0 fails that item."""
    max_wait_ms = 50.0

    def __init__(self, gate: asyncio.Event | None = None, **kw):
        super().__init__()
        for k, v in kw.items():
            setattr(self, k, v)
        self.batches: list[list[int]] = []
        self.gate = gate

    def cost(self, req):
        return req.cost

    async def process_batch(self, reqs):
        self.batches.append([r.x for r in reqs])
        if self.gate is not None:
            await self.gate.wait()
        for r in reqs:
            if r.x >= 0:
                r.out["square"] = r.x ** 2
        return [ValueError(f"negative {r.x}") if r.x < 0 else r.x ** 2
                for r in reqs]


@async_test()
async def test_groups_concurrent_callers_up_to_size_and_returns_each_its_own_result():
    sq = Square(max_batch_size=4, max_wait_ms=10_000)   # only size may cut a batch...
    async with Pipeline([sq]) as p:
        t0 = time.monotonic()
        reqs = [Job(x=i) for i in range(8)]
        out = await asyncio.gather(*(p.run(r) for r in reqs))
    assert time.monotonic() - t0 < 1.0                   # ...so nobody waited for max_wait
    assert out == [i * i for i in range(8)]
    assert sq.batches == [[0, 1, 2, 3], [4, 5, 6, 7]]    # arrival order kept
    assert [r.out["square"] for r in reqs] == out
    assert all(r.timings["square"].ran >= 0 for r in reqs)


@async_test()
async def test_cost_budget_cuts_batches_and_an_oversized_item_runs_alone():
    sq = Square(max_batch_size=100, max_batch_cost=10, max_wait_ms=5)
    costs = [4, 4, 4, 12, 3, 3, 3, 1]
    async with Pipeline([sq]) as p:
        out = await asyncio.gather(*(p.run(Job(x=i, cost=c))
                                     for i, c in enumerate(costs)))
    assert out == [i * i for i in range(8)]
    # 4+4 (a third 4 would be 12 > 10) | 4 (12 does not fit beside it) | 12 alone | 3+3+3+1
    assert sq.batches == [[0, 1], [2], [3], [4, 5, 6, 7]]


@async_test()
async def test_an_underfilled_batch_flushes_after_max_wait():
    sq = Square(max_batch_size=8, max_wait_ms=30)
    async with Pipeline([sq]) as p:
        t0 = time.monotonic()
        out = await asyncio.gather(p.run(Job(x=2)), p.run(Job(x=3)))
        took = time.monotonic() - t0
    assert out == [4, 9] and sq.batches == [[2, 3]]
    assert 0.025 <= took < 0.5
    # a request arriving alone also goes after max_wait, not never
    sq2 = Square(max_batch_size=8, max_wait_ms=5)
    async with Pipeline([sq2]) as p:
        assert await p.run(Job(x=7)) == 49


@async_test()
async def test_one_bad_item_fails_only_its_request():
    sq = Square(max_batch_size=8, max_wait_ms=5)
    async with Pipeline([sq]) as p:
        out = await asyncio.gather(*(p.run(Job(x=x)) for x in [1, -2, 3]),
                                   return_exceptions=True)
        assert sq.batches == [[1, -2, 3]]
        assert out[0] == 1 and out[2] == 9
        assert isinstance(out[1], StageError) and out[1].stage == "square"
        assert isinstance(out[1].cause, ValueError) and "negative -2" in str(out[1])


@async_test()
async def test_a_raising_batch_fails_its_members_only_and_bad_results_are_caught():
    class Flaky(BatchStage):
        max_batch_size, max_wait_ms = 2, 5
        calls = 0

        def cost(self, req):
            if req.x == "bad cost":
                raise ValueError("cannot cost")
            return 1

        async def process_batch(self, reqs):
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("device lost")
            if self.calls == 2:
                return [1]                           # wrong length
            return [r.x for r in reqs]

    async with Pipeline([Flaky()]) as p:
        first = await asyncio.gather(p.run(Job(x=1)), p.run(Job(x=2)),
                                     return_exceptions=True)
        assert all(isinstance(e, StageError) and "device lost" in str(e) for e in first)
        second = await asyncio.gather(p.run(Job(x=1)),
                                      p.run(Job(x=2)), return_exceptions=True)
        assert all(isinstance(e, StageError) and isinstance(e.cause, TypeError)
                   for e in second)
        with pytest.raises(StageError, match="cannot cost"):
            await p.run(Job(x="bad cost"))
        assert await asyncio.gather(p.run(Job(x=5)),
                                    p.run(Job(x=6))) == [5, 6]


@async_test()
async def test_arrivals_accumulate_while_the_batch_slot_is_busy():
    gate = asyncio.Event()
    sq = Square(gate, max_batch_size=16, max_wait_ms=1)
    async with Pipeline([sq]) as p:
        first = asyncio.ensure_future(p.run(Job(x=0)))
        while not sq.batches:
            await asyncio.sleep(0.001)
        rest = [asyncio.ensure_future(p.run(Job(x=i))) for i in range(1, 6)]
        await asyncio.sleep(0.01)                 # well past max_wait: no slot, so no batch
        assert sq.batches == [[0]] and sq.queued == 5
        gate.set()
        assert await asyncio.gather(first, *rest) == [0, 1, 4, 9, 16, 25]
    assert sq.batches == [[0], [1, 2, 3, 4, 5]]


@async_test()
async def test_a_request_cancelled_while_queued_never_reaches_the_batch():
    gate = asyncio.Event()
    sq = Square(gate, max_batch_size=16, max_wait_ms=1)
    after = []

    async def later(req):
        after.append(req.x)
        return req.out["square"]

    async with Pipeline([sq, later], max_in_flight=10) as p:
        reqs = [Job(x=i) for i in range(4)]
        tasks = [asyncio.ensure_future(p.run(reqs[0]))]
        while not sq.batches:
            await asyncio.sleep(0.001)
        tasks += [asyncio.ensure_future(p.run(r)) for r in reqs[1:]]
        await settle()
        assert sq.batches == [[0]] and sq.queued == 3      # 1..3 queued behind the busy slot
        assert reqs[2].stage == "square" and reqs[2].cancel()
        with pytest.raises(RequestCancelled) as ei:
            await tasks[2]
        assert ei.value.stage == "square"
        assert sq.queued == 2 and p.in_flight == 3          # its pipeline slot is free
        gate.set()
        out = await asyncio.gather(*(tasks[i] for i in (0, 1, 3)))
    assert out == [0, 1, 9]
    assert sq.batches == [[0], [1, 3]]                      # 2 never batched
    assert sorted(after) == [0, 1, 3]                       # nor reached the later stage


@async_test()
async def test_a_request_cancelled_mid_batch_does_not_disturb_the_others():
    gate = asyncio.Event()
    sq = Square(gate, max_batch_size=3, max_wait_ms=1)
    async with Pipeline([sq]) as p:
        reqs = [Job(x=i) for i in range(3)]
        tasks = [asyncio.ensure_future(p.run(r)) for r in reqs]
        while not sq.batches:
            await asyncio.sleep(0.001)
        reqs[1].cancel()
        with pytest.raises(RequestCancelled):
            await tasks[1]
        gate.set()
        assert [await tasks[0], await tasks[2]] == [0, 4]
    assert sq.batches == [[0, 1, 2]]


@async_test()
async def test_queue_bound_and_close_used_standalone():
    gate = asyncio.Event()
    sq = Square(gate, max_batch_size=1, max_wait_ms=1, max_queue=2)
    first = asyncio.ensure_future(sq.run(Job(x=0)))
    while not sq.batches:
        await asyncio.sleep(0.001)
    queued = [asyncio.ensure_future(sq.run(Job(x=i))) for i in (1, 2)]
    await settle()
    with pytest.raises(QueueFull) as ei:
        await sq.run(Job(x=3))
    assert ei.value.stage == "square"
    await sq.close()                     # stops the collector and the running batch
    for t in [first, *queued]:
        with pytest.raises(PipelineClosed):
            await t
    with pytest.raises(PipelineClosed):
        await sq.run(Job(x=4))
    await sq.close()                     # idempotent
