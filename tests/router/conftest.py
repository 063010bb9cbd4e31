"""Real processes for the router tests: tiny Gemma 3 workers (`server.py --router-redis`) on
127.0.0.1, real redis-server processes, `python -m mimo.router`, the official openai client."""
from __future__ import annotations

import time

import httpx
import pytest
from helpers.redis_servers import RedisServer

from mimo.bench.router_process import RouterProcess, WorkerProcess, start_all

HB = "0.2"      # worker heartbeat (s): the TTL is 6 of them


PAGE = 16       # the workers' page size (the server's default)


def whole_pages(cached: int, page: int = PAGE) -> int:
    """The part of a reported hit the router predicts: whole pages. After them a worker may
    copy the first rows of one more page (kvcache/radix/tails.py), which no published page
    key names, so `cached_tokens` can exceed the prediction by less than a page."""
    return cached // page * page


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from mimo.models.tiny import gemma3
    d = tmp_path_factory.mktemp("tiny_gemma3_router")
    gemma3.write(d, seed=3)
    return d


def worker_flags(tiny_dir, redis_url: str | None, *extra: str) -> list[str]:
    flags = ["--model", str(tiny_dir), "--dtype", "float32", "--kv-cache-memory", "32MiB",
             "--threads", "1", "--router-heartbeat", HB, *extra]
    if redis_url:
        flags += ["--router-redis", redis_url]
    return flags


def start_workers(tiny_dir, redis_url, n: int, *extra: str) -> list[WorkerProcess]:
    return start_all(lambda i, wait: WorkerProcess(worker_flags(tiny_dir, redis_url, *extra),
                                                   wait=wait), n)


def start_router(tiny_dir, redis_url, workers, *extra: str) -> RouterProcess:
    flags = ["--model", str(tiny_dir), "--health-interval", "0.3", *extra]
    if redis_url:
        flags += ["--redis", redis_url]
    for w in workers:
        flags += ["--worker", w.url]
    return RouterProcess(flags)


def wait_published(redis_url_or_client, workers, timeout: float = 10.0) -> None:
    """Until every worker's heartbeat is in Redis."""
    import redis
    c = (redis.Redis.from_url(redis_url_or_client) if isinstance(redis_url_or_client, str)
         else redis_url_or_client)
    until = time.time() + timeout
    while time.time() < until:
        if all(c.get(f"{{mimo:rt}}:hb:{w.url}") for w in workers):
            return
        time.sleep(0.05)
    raise AssertionError("workers did not publish heartbeats")


@pytest.fixture
def redis_server():
    r = RedisServer()
    yield r
    r.stop()


def client(router, **kw):
    from openai import OpenAI
    return OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0, timeout=120, **kw)


def chat_raw(router, model: str, messages, **kw):
    """A non-streamed chat through the router: (the parsed completion, the worker's URL)."""
    c = client(router)
    raw = c.chat.completions.with_raw_response.create(model=model, messages=messages,
                                                      temperature=0, **kw)
    return raw.parse(), raw.headers.get("x-mimo-worker")


def metric_total(router, name: str) -> float:
    return sum(router.counters().get(name, {}).values())


def decide(router, body: dict, kind: str = "chat") -> dict:
    return httpx.post(router.url + "/router/decide", json={"kind": kind, "body": body},
                      timeout=30).json()


def decide_when(router, body: dict, ok, timeout: float = 10.0, kind: str = "chat") -> dict:
    """The decision for `body` once `ok(decision)` holds (or the last one after `timeout`).
    Workers publish their cache asynchronously, after the response that filled it, so a
    decision taken at once may still see the tree from before the last request."""
    until = time.time() + timeout
    while True:
        d = decide(router, body, kind)
        if ok(d) or time.time() > until:
            return d
        time.sleep(0.05)


def decide_when_published(router, body: dict, worker: str, timeout: float = 10.0) -> dict:
    """The decision for `body` once it names `worker`, the one holding its prefix."""
    return decide_when(router, body, lambda d: d["worker"] == worker, timeout)


def stop_all(*procs) -> None:
    for p in procs:
        if isinstance(p, list):
            stop_all(*p)
        elif p is not None:
            p.stop()
