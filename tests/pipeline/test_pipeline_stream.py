"""Streaming stages: Pipeline.stream, transform chains (decode -> detokenize), early stop,
cancellation and errors mid-stream, slow consumers, a producer on another thread."""
from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest
from helpers.pipeline import Job, async_test, settle

from mimo.pipeline import Pipeline, RequestCancelled, Stage, StageError


class ThreadEngine:
    """A toy engine on its own thread: emits token i every `period` seconds until
    `n` tokens or an abort, handing each to the loop with call_soon_threadsafe."""

    def __init__(self, period=0.001):
        self.period = period
        self.aborted: list[str] = []
        self.threads: list[threading.Thread] = []

    def submit(self, rid, n, loop, queue):
        stop = threading.Event()

        def run():
            for i in range(n):
                if stop.wait(self.period):
                    self.aborted.append(rid)
                    return
                loop.call_soon_threadsafe(queue.put_nowait, i)
            loop.call_soon_threadsafe(queue.put_nowait, None)   # end of stream
        t = threading.Thread(target=run, daemon=True)
        self.threads.append(t)
        t.start()
        return stop


class Decode(Stage):
    """Streams token ids from the engine thread; aborts the engine's work if stopped."""
    max_concurrency = 4

    def __init__(self, engine: ThreadEngine):
        super().__init__()
        self.engine = engine
        self.open = 0

    async def process(self, req):
        q: asyncio.Queue = asyncio.Queue()
        stop = self.engine.submit(req.id, req.n, asyncio.get_running_loop(), q)
        self.open += 1
        try:
            while (tok := await q.get()) is not None:
                yield tok
        finally:
            stop.set()            # no-op when finished; an abort when cancelled/stopped
            self.open -= 1


class Detokenize(Stage):
    """A transform: ints -> words; ends the stream at a stop word."""

    async def process(self, req, upstream):
        async for tok in upstream:
            word = f"w{tok}"
            yield word
            if word == req.stop:
                return


def _join(engine):
    for t in engine.threads:
        t.join(1.0)


@async_test()
async def test_stream_yields_the_last_stages_items_in_order():
    eng = ThreadEngine()

    async def prepare(req):
        req.n = 5

    async with Pipeline([prepare, Decode(eng), Detokenize()]) as p:
        r = Job()
        items = [x async for x in p.stream(r)]
        assert items == [f"w{i}" for i in range(5)]
        assert set(r.timings) == {"prepare", "decode", "detokenize"}
        assert await p.run(Job()) == items         # run collects a stream
    _join(eng)
    assert eng.aborted == []


@async_test()
async def test_a_transform_stopping_early_closes_its_upstream_at_once():
    eng = ThreadEngine(period=0.002)
    dec = Decode(eng)
    async with Pipeline([dec, Detokenize()]) as p:
        r = Job(n=1000, stop="w2")
        assert [x async for x in p.stream(r)] == ["w0", "w1", "w2"]
        assert dec.open == 0 and p.in_flight == 0              # decode's finally ran
    _join(eng)
    assert eng.aborted == [r.id]


@async_test()
async def test_consumer_breaking_or_cancelling_cancels_the_request():
    eng = ThreadEngine(period=0.002)
    dec = Decode(eng)
    async with Pipeline([dec, Detokenize()]) as p:
        r = Job(n=1000)
        async with contextlib.aclosing(p.stream(r)) as s:
            async for item in s:
                if item == "w1":
                    break
        assert r.cancelled and dec.open == 0 and p.in_flight == 0

        r2 = Job(n=1000)

        async def consume():
            async for _ in p.stream(r2):
                pass
        t = asyncio.ensure_future(consume())
        while "decode" not in r2.timings and dec.open == 0:
            await asyncio.sleep(0.001)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        assert r2.cancelled and dec.open == 0 and p.in_flight == 0

        r3 = Job(n=1000)
        got = []
        with pytest.raises(RequestCancelled):
            async for item in p.stream(r3):
                got.append(item)
                if len(got) == 2:
                    r3.cancel()                 # cancelled from elsewhere mid-stream
        assert got == ["w0", "w1"] and dec.open == 0
    _join(eng)
    assert sorted(eng.aborted) == sorted([r.id, r2.id, r3.id])


@async_test()
async def test_an_error_mid_stream_fails_that_stream_only():
    async def numbers(req):
        for i in range(5):
            if i == req.fail_at:
                raise ValueError(f"bad token {i}")
            yield i

    async with Pipeline([numbers]) as p:
        got = []
        with pytest.raises(StageError) as ei:
            async for x in p.stream(Job(fail_at=3)):
                got.append(x)
        assert got == [0, 1, 2] and ei.value.stage == "numbers"
        assert [x async for x in p.stream(Job())] == [0, 1, 2, 3, 4]


@async_test()
async def test_stream_of_a_plain_pipeline_and_a_slow_consumer():
    async def one(req):
        return "only"

    async with Pipeline([one]) as p:
        assert [x async for x in p.stream(Job())] == ["only"]

    produced = []

    async def fast(req):
        for i in range(100):
            produced.append(i)
            yield i

    async with Pipeline([fast], stream_buffer=4) as p:
        s = p.stream(Job())
        assert await s.__anext__() == 0
        await settle(20)
        assert len(produced) <= 4 + 2          # paused by the buffer, not run ahead
        rest = [x async for x in s]
        assert rest == list(range(1, 100))
