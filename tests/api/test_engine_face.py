"""The engine's face (mimo/engine/face.py): /metrics and the router's cache publisher read only
the snapshot the engine thread swaps in, never the scheduler, pools or caches from the event
loop; the snapshot says what the engine holds; `fit` is the one request-size rule."""
from __future__ import annotations

import asyncio
import json
import os
import random
import threading

import httpx
import pytest

from mimo.api.app import Server, build_app
from mimo.config import ServerConfig
from mimo.engine.async_engine import AsyncEngine
from mimo.engine.engine import LLMEngine
from mimo.engine.face import ContextTooLong, fit
from mimo.engine.sampling_params import SamplingParams
from mimo.engine.snapshot import engine_stats
from mimo.llm import engine_config
from mimo.router.cache_events import heartbeat_key

ENGINE_THREAD = "mimo-engine"


class Guard:
    """Stands in for one of the engine's parts and records every attribute read made from
    another thread than the engine's while armed (a list shared by all guards)."""
    def __init__(self, target, name: str, seen: list, armed: threading.Event):
        object.__setattr__(self, "_g", (target, name, seen, armed))

    def __getattr__(self, attr):
        target, name, seen, armed = object.__getattribute__(self, "_g")
        thread = threading.current_thread().name
        if armed.is_set() and thread != ENGINE_THREAD:
            seen.append(f"{name}.{attr} read on thread {thread!r}")
        return getattr(target, attr)

    def __setattr__(self, attr, value):
        setattr(object.__getattribute__(self, "_g")[0], attr, value)

    def __bool__(self):
        return bool(object.__getattribute__(self, "_g")[0])


class FakeRedis:
    """What the publisher's heartbeat writes, without a Redis."""
    def __init__(self):
        self.sets: dict[str, bytes] = {}

    def pipeline(self, transaction=False):
        fake = self

        class Pipe:
            def set(self, key, value, px=None):
                fake.sets[key] = value

            def pexpire(self, key, ms):
                pass

            async def execute(self):
                return []
        return Pipe()


def _engine(d, **opts) -> LLMEngine:
    opts = {"dtype": "float32", "kv_cache_memory": "4MiB", "page_size": 4} | opts
    return LLMEngine(engine_config(str(d), **opts), progress=False)


def test_metrics_and_publisher_never_touch_engine_state_off_the_engine_thread(tiny_hf_dir):
    eng = _engine(tiny_hf_dir[0], max_num_batched_tokens=64)   # several steps in all
    ae = AsyncEngine(eng)
    server = Server(ServerConfig(), ae, "tiny")
    pub = ae.publisher("redis://127.0.0.1:9", "http://127.0.0.1:1")
    pub._client = FakeRedis()
    seen: list[str] = []
    armed = threading.Event()
    for part in ("scheduler", "pool", "cache", "model", "runner", "decode"):
        setattr(eng, part, Guard(getattr(eng, part), part, seen, armed))

    async def main():
        ae.start()
        transport = httpx.ASGITransport(app=build_app(server))
        params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
        streams = [ae.submit([5 + i] * (20 + 7 * i), params) for i in range(6)]
        loads, texts = [], []
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            while not all(s.seq.finish_reason for s in streams):
                armed.set()         # only the scrape and the heartbeat run on the loop now
                texts.append((await c.get("/metrics")).text)
                await pub._heartbeat()
                loads.append(json.loads(pub._client.sets[heartbeat_key(pub.url)]))
                armed.clear()
                await asyncio.sleep(0.005)
            for s in streams:
                async for _ in s:
                    pass
            await asyncio.sleep(0.2)    # the idle engine publishes its last snapshot
            armed.set()
            final = (await c.get("/metrics")).text
            await pub._heartbeat()
            armed.clear()
        await ae.stop()
        return loads, texts, final
    loads, texts, final = asyncio.run(main())
    assert seen == [], seen[:10]
    assert len(texts) >= 1
    # Mid-run the heartbeat saw queued or running work; at the end none.
    assert any(ld["running"] + ld["waiting"] > 0 for ld in loads)
    last = json.loads(pub._client.sets[heartbeat_key(pub.url)])
    assert (last["waiting"], last["running"], last["uncached_tokens"]) == (0, 0, 0)
    st = ae.stats
    assert st.steps > 0 and f"mimo_engine_steps {float(st.steps)}" in final
    for name, p in st.pools.items():
        assert p["in_use"] == 0 and p["free"] + p["evictable"] == p["capacity"], (name, p)
        assert f'mimo_kv_pool_pages{{pool="{name}",state="in_use"}} 0.0' in final


def test_snapshot_counts_what_the_engine_holds(tiny_hf_dir):
    """Before a step every request waits with its whole prompt uncached; after one step
    with room for all of them every one runs with its prompt computed."""
    eng = _engine(tiny_hf_dir[0], kv_cache_memory="16MiB")
    lens = [9, 17, 30]
    for i, n in enumerate(lens):
        eng.add_request([7 + i] * n, SamplingParams(max_tokens=4, temperature=0))
    st = engine_stats(eng, 0)
    assert (st.waiting, st.running, st.uncached_tokens) == (3, 0, sum(lens))
    eng.step()
    st = engine_stats(eng, 1)
    assert (st.waiting, st.running, st.uncached_tokens) == (0, 3, 0)
    full = st.pools["full"]
    # Page size 4: each request holds its prompt and its first sampled token.
    assert full["in_use"] >= sum(-(-(n + 1) // 4) for n in lens)
    assert full["free"] + full["evictable"] + full["in_use"] == full["capacity"]
    with pytest.raises(TypeError):
        st.pools["full"]["free"] = 0        # the snapshot is read-only


def _fit_reference(n, m, limit, kv, fill, min_tokens):
    """Brute force: the largest max_tokens the request may run with, or None (refused)."""
    if n >= limit:
        return None
    if not fill:
        return m if n + m <= limit else None
    for r in range(m, -1, -1):
        if n + r <= limit and (kv - n < 1 or n + r <= kv):
            return r if r >= min_tokens else None
    return None


def test_fit_is_the_context_and_kv_rule():
    rng = random.Random(int(os.environ.get("SEED", "0")) if os.environ.get("CI") else None)
    for _ in range(3000):
        limit = rng.randint(2, 64)
        kv = rng.randint(0, 80)
        n, m = rng.randint(1, 70), rng.randint(1, 70)
        fill, min_tokens = rng.random() < 0.5, rng.randint(0, 8)
        want = _fit_reference(n, m, limit, kv, fill, min_tokens)
        try:
            got = fit(n, m, limit, kv, fill=fill, min_tokens=min_tokens)
        except ContextTooLong as e:
            assert want is None, (n, m, limit, kv, fill, min_tokens, str(e))
            assert e.param == ("min_tokens" if n < limit and fill else "prompt")
            continue
        assert got == want, (n, m, limit, kv, fill, min_tokens)


def test_check_refuses_like_the_engine(tiny_hf_dir):
    eng = _engine(tiny_hf_dir[0])
    ae = AsyncEngine(eng)
    limit = ae.info.max_model_len
    assert ae.check(10, 5) == 5
    with pytest.raises(ContextTooLong, match="room for one more"):
        ae.check(limit, 1)
    with pytest.raises(ContextTooLong, match="exceeds the context"):
        ae.check(limit - 3, 4)
    assert ae.check(limit - 3, 100, fill=True) == min(3, ae.info.kv_tokens - (limit - 3))
    # The engine itself refuses with the same rule.
    with pytest.raises(ContextTooLong):
        eng.new_sequence([5] * (limit - 3), SamplingParams(max_tokens=4))
