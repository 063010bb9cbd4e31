"""An idle engine waits (briefly) for requests still on their way, so a burst's first step
plans them together; a lone request never waits; every arrival is closed."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from mimo.engine.arrivals import Arrivals
from mimo.engine.async_engine import AsyncEngine
from mimo.engine.engine import LLMEngine
from mimo.engine.sampling_params import SamplingParams
from mimo.llm import engine_config

OPTS = {"dtype": "float32", "kv_cache_memory": "4MiB", "page_size": 4}
GREEDY = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)


def test_arrivals_count_open_ones_and_close_once():
    woke = []
    a = Arrivals(lambda: woke.append(1))
    x, y = a.open(), a.open()
    assert a.pending == 2
    x.close()
    x.close()                       # idempotent: counted once
    assert a.pending == 1 and woke == [1]
    y.close()
    assert a.pending == 0 and woke == [1, 1]


def test_gather_wait_must_not_be_negative(tiny_hf_dir):
    eng = LLMEngine(engine_config(str(tiny_hf_dir[0]), **OPTS), progress=False)
    with pytest.raises(ValueError, match="gather_wait"):
        AsyncEngine(eng, gather_wait=-1)


class Recorded(list):
    """The prompt tokens each step computes; `engine`: the engine, for its integrity check
    once the AsyncEngine has stopped (its thread no longer touches it)."""
    engine: LLMEngine


def _engine(tiny_hf_dir, gather_wait: float) -> tuple[AsyncEngine, Recorded]:
    """An AsyncEngine whose steps record the prompt tokens each one computes."""
    steps = Recorded()

    def factory() -> LLMEngine:
        eng = steps.engine = LLMEngine(engine_config(str(tiny_hf_dir[0]), **OPTS),
                                       progress=False)
        schedule = eng.scheduler.schedule

        def recorded(*a, **k):
            out = schedule(*a, **k)
            steps.append(sorted(c.n for c in out))
            return out
        eng.scheduler.schedule = recorded
        return eng

    return AsyncEngine.build(factory, gather_wait=gather_wait), steps


async def _tokens(stream) -> list[int]:
    out: list[int] = []
    async for ev in stream:
        out += ev.token_ids
    return out


def test_an_idle_engine_plans_a_request_on_its_way_into_its_first_step(tiny_hf_dir):
    ae, steps = _engine(tiny_hf_dir, gather_wait=30.0)

    async def run():
        ae.start()
        try:
            late = ae.arriving()            # the second request, still being tokenized
            t0 = time.perf_counter()
            first = ae.submit([5, 6, 7, 8, 9], GREEDY, arrival=ae.arriving())
            await asyncio.sleep(0.3)
            assert steps == []              # nothing planned while one is on its way
            second = ae.submit([10, 11, 12], GREEDY, arrival=late)
            got = await asyncio.gather(_tokens(first), _tokens(second))
            return got, time.perf_counter() - t0
        finally:
            await ae.stop()

    (a, b), took = asyncio.run(run())
    steps.engine.check_integrity()      # free + evictable + in_use == capacity, nothing held
    assert len(a) == 2 and len(b) == 2
    assert steps[0] == [3, 5]               # both prompts in the first step
    assert took < 10                        # it went on when the second came, not at 30 s
    assert ae.arrivals.pending == 0


def test_a_lone_request_does_not_wait(tiny_hf_dir):
    ae, steps = _engine(tiny_hf_dir, gather_wait=30.0)

    async def run():
        ae.start()
        try:
            t0 = time.perf_counter()
            out = await _tokens(ae.submit([5, 6, 7], GREEDY, arrival=ae.arriving()))
            return out, time.perf_counter() - t0
        finally:
            await ae.stop()

    out, took = asyncio.run(run())
    steps.engine.check_integrity()
    assert len(out) == 2 and took < 10 and steps[0] == [3]


def test_an_arrival_given_up_releases_the_wait(tiny_hf_dir):
    ae, steps = _engine(tiny_hf_dir, gather_wait=30.0)

    async def run():
        ae.start()
        try:
            doomed = ae.arriving()          # e.g. refused by the server before submit
            t0 = time.perf_counter()
            stream = ae.submit([5, 6, 7], GREEDY)
            threading.Timer(0.3, doomed.close).start()
            out = await _tokens(stream)
            return out, time.perf_counter() - t0
        finally:
            await ae.stop()

    out, took = asyncio.run(run())
    steps.engine.check_integrity()
    assert len(out) == 2 and 0.25 < took < 10 and steps[0] == [3]


def test_the_wait_is_bounded_and_a_busy_engine_does_not_wait(tiny_hf_dir):
    ae, steps = _engine(tiny_hf_dir, gather_wait=1.0)

    async def run():
        ae.start()
        try:
            stuck = ae.arriving()           # never comes
            t0 = time.perf_counter()
            first = ae.submit([5, 6, 7], SamplingParams(temperature=0, max_tokens=60,
                                                        ignore_eos=True))
            it = first.__aiter__()
            await it.__anext__()
            waited = time.perf_counter() - t0
            # Running now: a request arriving mid-stream joins the next step, no wait.
            t1 = time.perf_counter()
            second = await _tokens(ae.submit([8, 9], GREEDY))
            joined = time.perf_counter() - t1
            rest = [ev async for ev in it]
            stuck.close()
            return waited, joined, second, rest
        finally:
            await ae.stop()

    waited, joined, second, rest = asyncio.run(run())
    steps.engine.check_integrity()
    assert 0.95 < waited < 10               # waited for the arrival, at most gather_wait
    assert joined < 0.9 and len(second) == 2 and rest
