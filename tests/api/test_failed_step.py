"""A failed engine step as HTTP clients see it (the app in process, a tiny checkpoint): the
request gets a 500 in OpenAI's shape, streamed or not (before its first item; a stream that
already started ends with an error event, `Server._sse`), the next request is served, and
/metrics counts the failed steps. An engine left inconsistent turns /health into 503 and asks
the server to stop."""
import asyncio

import httpx

from mimo.api.app import Server, build_app
from mimo.config import ServerConfig
from mimo.engine.async_engine import AsyncEngine
from mimo.engine.decode_step import PlainDecode
from mimo.engine.engine import LLMEngine
from mimo.engine.parts import EngineParts
from mimo.llm import engine_config


class FailCalls(PlainDecode):
    """The forward raises on the listed call numbers (1-based); `corrupt`: and leaves the
    pools inconsistent first."""
    def __init__(self, fail_on=(), corrupt=False):
        self.fail_on, self.corrupt, self.calls = set(fail_on), corrupt, 0

    def execute(self, runner, head, chunks):
        self.calls += 1
        if self.calls in self.fail_on:
            if self.corrupt:
                a = runner.pool.full.allocator
                a._free.append(a._free[-1])
            raise RuntimeError("injected fault")
        return super().execute(runner, head, chunks)


def _serve(d, step):
    eng = LLMEngine(engine_config(str(d), dtype="float32", kv_cache_memory="4MiB", page_size=4),
                    progress=False, parts=EngineParts(decode=step))
    ae = AsyncEngine(eng)
    return ae, Server(ServerConfig(), ae, "tiny")


BODY = {"model": "tiny", "prompt": [5, 6, 7, 8, 9], "max_tokens": 6, "temperature": 0,
        "ignore_eos": True}


def test_failed_steps_answer_500_or_an_error_event_and_the_server_goes_on(tiny_hf_dir):
    async def main():
        ae, server = _serve(tiny_hf_dir[0], FailCalls(fail_on={1, 2}))
        ae.start()
        transport = httpx.ASGITransport(app=build_app(server))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            r = await c.post("/v1/completions", json=BODY)          # call 1 fails
            assert r.status_code == 500
            err = r.json()["error"]
            assert err["type"] == "server_error" and "injected" not in err["message"]
            r = await c.post("/v1/completions", json=BODY | {"stream": True})
            assert r.status_code == 500     # call 2 fails before the stream's first item
            r = await c.post("/v1/completions", json=BODY)           # served as usual
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6
            m = (await c.get("/metrics")).text
            assert "mimo_failed_steps_total 2.0" in m
            assert (await c.get("/health")).status_code == 200
        ae._engine.check_integrity()
        await ae.stop()
    asyncio.run(main())


def test_an_inconsistent_engine_turns_health_to_503_and_stops(tiny_hf_dir):
    async def main():
        ae, server = _serve(tiny_hf_dir[0], FailCalls(fail_on={1}, corrupt=True))
        stopped = asyncio.Event()
        ae.on_fatal = lambda err: stopped.set()
        ae.start()
        transport = httpx.ASGITransport(app=build_app(server))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            r = await c.post("/v1/completions", json=BODY)
            assert r.status_code == 500
            await asyncio.wait_for(stopped.wait(), 10)
            h = await c.get("/health")
            assert h.status_code == 503 and h.json()["status"] == "error"
            r = await c.post("/v1/completions", json=BODY)
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_stopped"
        await ae.stop()
    asyncio.run(main())
