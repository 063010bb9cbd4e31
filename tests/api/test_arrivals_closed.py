"""Every request the server starts is noted on its way to the engine (engine/arrivals.py)
and the note is closed whatever becomes of it: served, refused before the engine, failed
in a step, streamed, or given up by the client. A note left open would make every idle
engine wait its whole gather time before each first step."""
import asyncio

import httpx

from mimo.api.app import Server, build_app
from mimo.config import ServerConfig
from mimo.engine.async_engine import AsyncEngine
from mimo.engine.decode_step import PlainDecode
from mimo.engine.engine import LLMEngine
from mimo.engine.parts import EngineParts
from mimo.llm import engine_config

BODY = {"model": "tiny", "prompt": [5, 6, 7, 8, 9], "max_tokens": 4, "temperature": 0,
        "ignore_eos": True}


class FailFirst(PlainDecode):
    def __init__(self):
        self.calls = 0

    def execute(self, runner, head, chunks):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("injected fault")
        return super().execute(runner, head, chunks)


def test_every_arrival_is_closed(tiny_hf_dir):
    async def main():
        eng = LLMEngine(engine_config(str(tiny_hf_dir[0]), dtype="float32",
                                      kv_cache_memory="4MiB", page_size=4),
                        progress=False, parts=EngineParts(decode=FailFirst()))
        ae = AsyncEngine(eng, gather_wait=30.0)
        ae.start()
        opened = []
        arriving = ae.arriving

        def counted():
            a = arriving()
            opened.append(a)
            return a
        ae.arriving = counted
        server = Server(ServerConfig(), ae, "tiny")
        transport = httpx.ASGITransport(app=build_app(server))
        async with httpx.AsyncClient(transport=transport, base_url="http://test",
                                     timeout=20) as c:
            r = await c.post("/v1/completions", json=BODY)              # a failed step
            assert r.status_code == 500
            r = await c.post("/v1/completions", json=BODY | {"prompt": [10**9]})   # refused
            assert r.status_code == 400
            ctx = server.engine.info.max_model_len       # refused before the engine:
            r = await c.post("/v1/completions", json=BODY | {"max_tokens": ctx - 2})
            assert r.status_code == 400     # the prompt and max_tokens overrun the context
            r = await c.post("/v1/completions", json=BODY | {"n": 3})     # served, 3 samples
            assert r.status_code == 200 and len(r.json()["choices"]) == 3
            r = await c.post("/v1/chat/completions", json={
                "model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3, "stream": True})
            assert r.status_code == 200 and "[DONE]" in r.text
            async with c.stream("POST", "/v1/completions",                # given up
                                json=BODY | {"stream": True, "max_tokens": 50}) as s:
                async for _ in s.aiter_lines():
                    break
        for _ in range(100):        # the abandoned stream's handler finishes on its own
            if ae.arrivals.pending == 0:
                break
            await asyncio.sleep(0.05)
        pending = ae.arrivals.pending
        await ae.stop()
        eng.check_integrity()       # free + evictable + in_use == capacity, nothing held
        return opened, pending

    opened, pending = asyncio.run(main())
    assert len(opened) >= 7 and pending == 0
