"""Composition, ordering, data flow, concurrency limits, per-request errors."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from helpers.pipeline import Gauge, Job, async_test, settle

from mimo.pipeline import (
    FunctionStage,
    InvalidRequest,
    Pipeline,
    PipelineError,
    Request,
    Stage,
    StageError,
    StageTiming,
)


class Record(Stage):
    """Appends its name to req.trace after a yield to the loop, writes a tag to
    req.out[name] and returns it."""

    def __init__(self, name, log=None, **kw):
        super().__init__(name, **kw)
        self.log = log

    async def process(self, req):
        await asyncio.sleep(0)
        req.trace.append(self.name)
        if self.log is not None:
            self.log.append((req.id, self.name))
        req.out[self.name] = tag = f"{self.name}:{req.x}"
        return tag


@async_test()
async def test_stages_run_in_order_and_fill_the_request():
    log = []
    async with Pipeline([Record("a", log), Record("b", log), Record("c", log)]) as p:
        reqs = [Job(x=i) for i in range(10)]
        out = await asyncio.gather(*(p.run(r) for r in reqs))
    assert out == [f"c:{i}" for i in range(10)]            # run returns the last value
    for i, r in enumerate(reqs):
        assert r.trace == ["a", "b", "c"]
        assert r.out == {"a": f"a:{i}", "b": f"b:{i}", "c": f"c:{i}"}
        assert set(r.timings) == {"a", "b", "c"}
        assert all(isinstance(t, StageTiming) and t.waited >= 0 and t.ran >= 0
                   for t in r.timings.values())
        assert r.stage is None and not r.running
        # per request, stage order holds even though requests interleave
        mine = [s for rid, s in log if rid == r.id]
        assert mine == ["a", "b", "c"]
    assert [s for _, s in log[:10]] == ["a"] * 10    # requests overlap; no stage is global
    assert p.in_flight == 0 and p.queued == 0


@async_test()
async def test_function_stages_none_results_and_typed_request():
    @dataclass(eq=False, kw_only=True)
    class Doc(Request):
        text: str
        words: int = 0

    async def count(req: Doc):
        req.words = len(req.text.split())        # fills the request, returns None

    async def shout(req: Doc):
        return req.text.upper()

    async with Pipeline([count, FunctionStage(shout, "loud", max_concurrency=2)]) as p:
        assert [s.name for s in p.stages] == ["count", "loud"]
        d = Doc(text="one two three")
        assert await p.run(d) == "ONE TWO THREE"
    # A return value is the result, not stored on the request: the stages' typed fields are.
    assert d.words == 3 and not hasattr(d, "data") and not hasattr(d, "loud")
    assert d.id != Doc(text="x").id


@async_test()
async def test_concurrency_limit_is_honoured():
    gauges = {"limited": Gauge(), "free": Gauge()}

    class Slow(Stage):
        async def process(self, req):
            with gauges[self.name]:
                await asyncio.sleep(0.005)

    p = Pipeline([Slow("free"), Slow("limited", max_concurrency=3)])
    reqs = [Request() for _ in range(20)]
    await asyncio.gather(*(p.run(r) for r in reqs))
    await p.close()
    assert gauges["limited"].max == 3
    assert gauges["free"].max > 3          # the unbounded stage overlaps more
    # waiting for the limited stage's slot shows up as its waited time
    assert max(r.timings["limited"].waited for r in reqs) > 0.005
    assert max(r.timings["free"].waited for r in reqs) < 0.005


@async_test()
async def test_waiting_for_a_slot_is_recorded_and_fifo():
    order = []
    gate = asyncio.Event()

    class One(Stage):
        max_concurrency = 1

        async def process(self, req):
            order.append(req.i)
            await gate.wait()

    async with Pipeline([One()]) as p:
        tasks = [asyncio.ensure_future(p.run(Job(i=i))) for i in range(5)]
        await settle()
        assert order == [0]
        gate.set()
        await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]


@async_test()
async def test_an_exception_fails_only_its_request_and_the_pipeline_keeps_serving():
    ran_after = []

    async def parse(req):
        x = req.x
        if x == 3:
            raise KeyError("boom")
        if x == 5:
            raise InvalidRequest("x must not be 5")
        req.out["parse"] = x * 10

    async def after(req):
        ran_after.append(req.x)
        return req.out["parse"] + 1

    async with Pipeline([parse, after]) as p:
        out = await asyncio.gather(*(p.run(Job(x=i)) for i in range(8)),
                                   return_exceptions=True)
        assert [o for i, o in enumerate(out) if i not in (3, 5)] == [1, 11, 21, 41, 61, 71]
        err = out[3]
        assert isinstance(err, StageError) and err.stage == "parse"
        assert isinstance(err.cause, KeyError) and err.__cause__ is err.cause
        assert "[parse] KeyError" in str(err)
        bad = out[5]
        assert type(bad) is InvalidRequest and bad.stage == "parse"
        assert sorted(ran_after) == [0, 1, 2, 4, 6, 7]       # later stage skipped for both
        assert await p.run(Job(x=9)) == 91      # still serving
        assert p.in_flight == 0


def test_construction_is_validated():
    async def a(req):
        pass

    async def gen(req):
        yield 1

    async def gen2(req):         # a streaming stage after another must take upstream
        yield 2

    def blocking(req):
        return 1

    with pytest.raises(ValueError, match="at least one"):
        Pipeline([])
    with pytest.raises(ValueError, match="named 'a'"):
        Pipeline([a, FunctionStage(a)])
    with pytest.raises(TypeError, match="does not stream"):
        Pipeline([gen, a])
    with pytest.raises(TypeError, match="upstream"):
        Pipeline([gen, gen2])
    with pytest.raises(TypeError, match="not an async function"):
        Pipeline([blocking])
    with pytest.raises(ValueError, match="max_in_flight"):
        Pipeline([a], max_in_flight=0)

    class CamelCase(Stage):
        async def process(self, req):
            pass
    assert CamelCase().name == "camel_case" and CamelCase("x").name == "x"


@async_test()
async def test_request_reuse_rules():
    gate = asyncio.Event()

    async def wait(req):
        await gate.wait()
        return "ok"

    async with Pipeline([wait]) as p:
        r = Request()
        t = asyncio.ensure_future(p.run(r))
        await settle()
        assert r.running
        with pytest.raises(PipelineError, match="already running"):
            await p.run(r)
        gate.set()
        assert await t == "ok"
        assert await p.run(r) == "ok"          # sequential re-runs are fine (a retry)
        r2 = Request()
        assert r2.cancel("user changed their mind") and not r2.cancel("again")
        with pytest.raises(PipelineError, match="user changed their mind"):
            await p.run(r2)
