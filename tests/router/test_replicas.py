"""Stateless replicas: two routers on one Redis (a single server, and a Redis Cluster) make
the same decisions over a replayed workload; killing one mid-run loses no request a client
retries on the other; a router started afresh routes by the shared state from its first
request."""
from __future__ import annotations

import threading
import time

import openai
from helpers.redis_servers import RedisCluster3

from mimo.bench.router_process import RouterProcess
from mimo.router.state import ROUTER_TTL_MS

from .conftest import (
    chat_raw,
    decide,
    start_router,
    start_workers,
    stop_all,
    wait_published,
    whole_pages,
)


def _settled(routers, body, timeout: float = 10.0):
    """Every router's decision for `body` once the shared state has settled: two reads
    0.05 s apart that agree with each other, router by router. What a decision reads
    changes for a moment after each response (the worker publishes its tree and load
    asynchronously, the serving router decrements its in-flight count and leaves a
    continuation mark asynchronously), and replicas that read on either side of such a
    write disagree through no fault of the shared state. Returns (decisions, settled)."""
    until = time.time() + timeout
    prev = [decide(rt, body) for rt in routers]
    while True:
        time.sleep(0.05)
        ds = [decide(rt, body) for rt in routers]
        key = [(d["worker"], d["predicted_cached_tokens"]) for d in ds]
        if key == [(d["worker"], d["predicted_cached_tokens"]) for d in prev]:
            return ds, True
        if time.time() > until:
            return ds, False
        prev = ds


def _replay(routers, model, sessions: int, turns: int):
    """Sessions in turn order, one request at a time: every router decides each request
    once the state has settled, the request goes through them in rotation and must land
    where they decided. Returns (agreements, decisions, log, conversations)."""
    agree = total = 0
    convs = [[{"role": "system", "content": f"replica system {i % 2} " * 25}]
             for i in range(sessions)]
    log = []
    k = 0
    for t in range(turns):
        for i, msgs in enumerate(convs):
            msgs.append({"role": "user", "content": f"session {i} turn {t} " * 3})
            body = {"model": model, "messages": msgs, "max_tokens": 4}
            ds, settled = _settled(routers, body)
            agree += settled and all(d["worker"] == ds[0]["worker"] for d in ds)
            total += 1
            served_by = k % len(routers)
            resp, w = chat_raw(routers[served_by], model, msgs, max_tokens=4)
            k += 1
            assert w == ds[served_by]["worker"], ("turn", t, "session", i, "router",
                                                  served_by, ds)
            log.append((i, t, w, ds[served_by]["predicted_cached_tokens"],
                        resp.usage.prompt_tokens_details.cached_tokens))
            msgs.append({"role": "assistant", "content": resp.choices[0].message.content})
    return agree, total, log, convs


def test_two_replicas_agree_and_survive_one_killed(redis_server, tiny_dir):
    r = redis_server
    ws = start_workers(tiny_dir, r.url, 3)
    a = b = c = None
    try:
        wait_published(r.url, ws)
        a = start_router(tiny_dir, r.url, ws)
        b = start_router(tiny_dir, r.url, ws)
        model = str(tiny_dir)
        agree, total, log, convs = _replay([a, b], model, 6, 4)
        assert agree >= 0.99 * total, (agree, total)
        assert sum(p for *_, p, _ in log) == sum(whole_pages(x) for *_, x in log)
        # Kill A while sessions run through it; clients retry on B.
        done, errors = [], []
        killed = threading.Event()

        def session(i):
            msgs = convs[i]
            for t in range(4, 8):
                msgs.append({"role": "user", "content": f"session {i} turn {t}"})
                for rt in (a, b):
                    try:
                        resp, w = chat_raw(rt, model, msgs, max_tokens=4)
                        break
                    except (openai.APIConnectionError, openai.InternalServerError):
                        continue
                else:
                    errors.append((i, t))
                    return
                done.append((i, t, w, resp.usage.prompt_tokens_details.cached_tokens))
                msgs.append({"role": "assistant", "content": resp.choices[0].message.content})
                if len(done) >= 6 and not killed.is_set():
                    killed.set()
                    a.kill()
        th = [threading.Thread(target=session, args=(i,)) for i in range(6)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        assert killed.is_set() and not errors and len(done) == 24
        # A fresh router (new id, no history) routes the next turns where they are cached.
        # (Once A's in-flight counts expired: requests it had in flight when killed weigh on
        # their workers' load for ROUTER_TTL_MS.)
        time.sleep(ROUTER_TTL_MS / 1000 + 0.5)
        c = start_router(tiny_dir, r.url, ws)
        last = {i: w for i, t, w, _ in sorted(done)}
        for i, msgs in enumerate(convs):
            msgs.append({"role": "user", "content": "and the fresh router?"})
            d = decide(c, {"model": model, "messages": msgs, "max_tokens": 4})
            resp, w = chat_raw(c, model, msgs, max_tokens=4)
            assert w == d["worker"] == last[i]
            assert d["predicted_cached_tokens"] == whole_pages(
                resp.usage.prompt_tokens_details.cached_tokens) > 0
            msgs.append({"role": "assistant", "content": resp.choices[0].message.content})
    finally:
        stop_all(a, b, c, ws)


def test_router_state_on_a_redis_cluster(tiny_dir):
    with RedisCluster3() as cl:
        ws = start_workers(tiny_dir, cl.url, 2)
        a = b = None
        try:
            import redis
            from redis.cluster import ClusterNode, RedisCluster
            host, port = cl.url[len("redis-cluster://"):].split(",")[0].split(":")
            rc = RedisCluster(startup_nodes=[ClusterNode(host, int(port))])
            wait_published(rc, ws)
            a = start_router(tiny_dir, cl.url, ws)
            b = RouterProcess(["--model", str(tiny_dir), "--redis", cl.url,
                               "--health-interval", "0.3"])
            agree, total, log, _ = _replay([a, b], str(tiny_dir), 4, 3)
            assert agree == total
            assert sum(p for *_, p, _ in log) == sum(whole_pages(x) for *_, x in log) > 0
            assert isinstance(rc, redis.RedisCluster)
        finally:
            stop_all(a, b, ws)
