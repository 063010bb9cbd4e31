"""pd-transport: one request's KV moved prefill -> decode over the transports the design
allows, on 127.0.0.1, the same bytes each way:

- direct: the workers' own path. A server process (starlette under uvicorn, as a prefill
  worker) answers with the payload's stream (`mimo.disagg.wire`, one frame per layer,
  encoded as it is sent); the client reads it with httpx into host tensors (`wire.decode`),
  as a decode worker does.
- redis: the tier layer's Redis path (`RedisStore`, the L3 store `--kv-storage` uses): the
  sender puts the stream's frames as entries (one key per frame, checksummed), the receiver
  gets them and decodes the same frames. Store-and-forward: the bytes cross twice, measured
  one after the other (a receiver polling per layer could overlap the halves, at best
  halving the sum).

The payload is a real `KVPayload` of the model's layout (`--shape`, from the known shapes:
no weights) at each prompt length: full layers' pages for every token, SWA layers' window
pages only, random values. Each figure is the median of `--reps` timed transfers after one
warm-up; every transfer is checked bit for bit against what was sent.

    python -m mimo.bench pd-transport [--shape gemma-3-270m] [--tokens 2048,8192] [--reps 5]

Progress on stderr; one JSON line on stdout.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

FP = "bench"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("pd-transport", help="KV transfer time: direct worker stream "
                                                   "vs the tier layer's Redis path")
    p.add_argument("--shape", default="gemma-3-270m")
    p.add_argument("--tokens", default="2048,8192")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--reps", type=int, default=5)
    return p


def _log(msg: str) -> None:
    print(f"[pd-transport] {msg}", file=sys.stderr, flush=True)


def payload(shape: str, dtype: str, tokens: int, page: int, seed: int = 0):
    """A random KVPayload of `shape`'s layout for a `tokens`-token prompt, and the layout."""
    import torch

    from ..kvcache.kv_payload import KVPayload
    from ..kvcache.pool.layout import shape_layout
    layout = shape_layout(shape, dtype)
    p = KVPayload.empty(layout, tokens, page, getattr(torch, dtype))
    g = torch.Generator().manual_seed(seed)
    for k, v in p.full + p.swa:
        k.copy_(torch.randn(k.shape, generator=g))
        v.copy_(torch.randn(v.shape, generator=g))
    return p, layout


def _same(a, b) -> bool:
    import torch
    return all(torch.equal(x, y) for (k, v), (k2, v2) in zip(a.full + a.swa, b.full + b.swa)
               for x, y in ((k, k2), (v, v2)))


async def _direct(url: str, sent, layout, page: int) -> float:
    import httpx

    from ..disagg import wire
    async with httpx.AsyncClient(timeout=120) as c:
        t = time.perf_counter()
        async with c.stream("GET", f"{url}/kv?tokens={sent.tokens}") as r:
            got = await wire.decode(r.aiter_raw(), FP, layout, page, sent.tokens)
        dt = time.perf_counter() - t
    if not _same(sent, got.payload):
        raise RuntimeError("direct stream: the payload changed on the way")
    return dt


async def _redis(store, sent, layout, page: int, rep: int) -> tuple[float, float]:
    from ..disagg import wire

    async def chunks(values):
        for v in values:
            yield v
    t = time.perf_counter()
    frames = list(wire.encode(1, 0, sent, FP))
    keys = [f"pd-transport:{sent.tokens}:{rep}:{i}" for i in range(len(frames))]
    ok = await store.put(list(zip(keys, frames)), timeout=60)
    t_put = time.perf_counter() - t
    t = time.perf_counter()
    values = await store.get(keys, timeout=60)
    if not all(ok) or any(v is None for v in values):
        raise RuntimeError("redis: a frame was not stored or not found")
    got = await wire.decode(chunks(values), FP, layout, page, sent.tokens)
    t_get = time.perf_counter() - t
    await store.delete(keys, timeout=60)
    if not _same(sent, got.payload):
        raise RuntimeError("redis: the payload changed on the way")
    return t_put, t_get


async def _both(url: str, redis_url: str, sent, layout, page: int, reps: int
                ) -> tuple[list[float], list[tuple[float, float]]]:
    """`reps` timed transfers each way, after one warm-up each."""
    from ..kvcache.tiers.redis_store import RedisStore
    store = RedisStore(redis_url, socket_timeout=60)
    try:
        d = [await _direct(url, sent, layout, page) for _ in range(reps + 1)]
        r = [await _redis(store, sent, layout, page, i) for i in range(reps + 1)]
    finally:
        await store.aclose()
    return d[1:], r[1:]


def measure(shape: str, tokens: list[int], dtype: str = "float32", page: int = 16,
            reps: int = 5) -> dict:
    from ..disagg import wire
    from ..kvcache.kv_payload import full_kv_bytes
    from .redis_process import RedisServer
    from .router_process import LoopbackProcess
    rows = []
    server = LoopbackProcess(["-m", "mimo.bench.pd_transport"],
                             ["--serve", shape, "--dtype", dtype, "--page-size", str(page)])
    redis_server = RedisServer()
    try:
        for n in tokens:
            sent, layout = payload(shape, dtype, n, page)
            wire_bytes = sum(len(f) for f in wire.encode(1, 0, sent, FP))

            d, r = asyncio.run(_both(server.url, redis_server.url, sent, layout, page, reps))
            direct = statistics.median(d)
            put = statistics.median(x for x, _ in r)
            get = statistics.median(y for _, y in r)
            rows.append({"tokens": n, "wire_bytes": wire_bytes,
                         "full_kv_bytes": full_kv_bytes(layout, n),
                         "direct_s": round(direct, 4), "redis_put_s": round(put, 4),
                         "redis_get_s": round(get, 4), "redis_s": round(put + get, 4),
                         "redis_over_direct": round((put + get) / direct, 2),
                         "direct_mb_s": round(wire_bytes / direct / 1e6, 1),
                         "redis_mb_s": round(wire_bytes / (put + get) / 1e6, 1)})
            _log(json.dumps(rows[-1]))
    finally:
        redis_server.stop()
        server.stop()
    return {"bench": "pd-transport", "shape": shape, "dtype": dtype, "page_size": page,
            "reps": reps, "bit_exact": True, "rows": rows}


def run(args) -> int:
    from ..cpu.features import cpu_info
    out = measure(args.shape, [int(t) for t in args.tokens.split(",")], args.dtype,
                  args.page_size, args.reps)
    info = cpu_info()
    out.update(cpu=info.model, cpu_flags=sorted(info.flags))
    print(json.dumps(out), flush=True)
    return 0


def _serve(argv: list[str]) -> None:
    """The sending side of `direct`: GET /kv?tokens=N streams that payload's frames."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    from ..disagg import wire
    from ..kvcache.kv_payload import KVPayload
    p = argparse.ArgumentParser()
    p.add_argument("--serve", required=True)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args(argv)
    made: dict[int, KVPayload] = {}

    async def kv(request):
        n = int(request.query_params["tokens"])
        if n not in made:
            made[n] = payload(a.serve, a.dtype, n, a.page_size)[0]
        return StreamingResponse(wire.encode(1, 0, made[n], FP),
                                 media_type="application/octet-stream")

    async def health(request):
        return PlainTextResponse("ok")
    app = Starlette(routes=[Route("/kv", kv), Route("/health", health)])
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning")


if __name__ == "__main__":
    _serve(sys.argv[1:])
