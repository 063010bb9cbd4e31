"""tiers: time to first token and bytes moved for a long prompt served from each KV tier.

One run, one model (default: the embedded Gemma 3 270M), one prompt of --prompt-tokens:
- recompute: a cold engine prefills the whole prompt;
- L2: the prompt's KV was evicted from L1 to host memory (write-back) and comes back up;
- disk / Redis: a fresh engine (empty L1, as after a restart or on another replica) loads
  the prefix from a file: store or from Redis (a redis-server started on a loopback port
  unless --redis names one).
For each hit: TTFT as a fraction of recompute, the bytes read against the minimum (full
layers' KV for the hit plus SWA/MTP KV for the window before its end) and against what a
tier storing SWA layers like full ones would move. The Redis tier's lookup (its reads,
probes and checks) is timed against a raw `redis.asyncio` pipelined GET of the same entries,
the two alternated (at least 5 pairs; the throughput ratio is the median of the pairs').
Progress goes to stderr; the last line is one JSON object.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time

NAME = "tiers"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="TTFT and bytes moved per KV tier (L2, disk, Redis)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gemma-3-270m")
    p.add_argument("--prompt-tokens", type=int, default=8192)
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    p.add_argument("--kv-cache-memory", default="1GiB")
    p.add_argument("--host-kv-cache-memory", default="1GiB")
    p.add_argument("--redis", default=None, metavar="URL",
                   help="a Redis to use (default: start redis-server on a free loopback port)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per tier (median)")
    p.add_argument("--threads", type=int, default=None)
    return p


def _log(msg: str) -> None:
    print(f"[{NAME}] {msg}", file=sys.stderr, flush=True)


def _prompt(tokenizer, n: int, vocab: int) -> list[int]:
    """n tokens of real prose (the standard library's own documentation), or random ids for
    a model without a tokenizer. (Random ids give a flat next-token distribution, which is
    not what serving looks like.)"""
    if tokenizer is None:
        import torch
        g = torch.Generator().manual_seed(0)
        return torch.randint(10, vocab, (n,), generator=g).tolist()
    import argparse as a
    import asyncio as b
    import inspect
    import json as c
    import pathlib
    import subprocess as d
    mods = (a, b, c, d, inspect, pathlib)
    text = "\n\n".join(inspect.getdoc(m) or "" for m in mods)
    ids: list[int] = []
    while len(ids) < n:
        ids += tokenizer.encode(text)
    return ids[:n]


def _ttft(llm, prompt) -> tuple[float, int]:
    from ..engine.sampling_params import SamplingParams
    t0 = time.perf_counter()
    out = llm.generate({"prompt_token_ids": prompt},
                       SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))[0]
    return time.perf_counter() - t0, out.cached_tokens


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


async def _raw_redis_read(url: str, names: list[str]) -> tuple[int, float]:
    import redis.asyncio as aredis
    r = aredis.Redis.from_url(url)
    try:
        await r.ping()
        t0 = time.perf_counter()
        pipe = r.pipeline(transaction=False)
        for n in names:
            pipe.get(n)
        vals = await pipe.execute()
        dt = time.perf_counter() - t0
    finally:
        await r.aclose()
    return sum(len(v) for v in vals if v is not None), dt


def _redis_load_vs_raw(llm, prompt, url: str, pairs: int) -> dict:
    """The tier's Redis lookup of the whole prompt (L1 emptied first) against a raw pipelined
    GET of the entries it read, alternated `pairs` times so that both see the same machine;
    the ratio of throughputs is the median of the pairs'."""
    c, pool = llm.engine.cache, llm.engine.pool
    loads, raws, ratios = [], [], []
    for _ in range(pairs):
        c.make_room(pool.full.allocator.capacity, pool.swa.allocator.capacity)
        plan = c.fetch_plan(prompt[:-1], None)
        assert plan is not None
        got = c.storage.fetch(plan).result()
        read = sum(len(v) for v in got.payloads.values())
        names = [c.keys.name(kind, key) for kind, key in got.payloads]
        raw_bytes, raw_s = asyncio.run(_raw_redis_read(url, names))
        loads.append(got.seconds)
        raws.append(raw_s)
        ratios.append((read / got.seconds) / (raw_bytes / raw_s))
    load_s = _median(loads)
    return {"redis_tier_load_s": round(load_s, 4),
            "redis_tier_load_MBps": round(read / load_s / 1e6, 1),
            "redis_raw_read_MBps": round(raw_bytes / _median(raws) / 1e6, 1),
            "redis_load_vs_raw": round(_median(ratios), 3)}


def _recompute(llm, prompt, warm, repeats: int) -> float:
    _ttft(llm, warm)
    times = []
    for i in range(repeats):
        llm.engine.cache.make_room(llm.engine.pool.full.allocator.capacity,
                                   llm.engine.pool.swa.allocator.capacity)
        t, cached = _ttft(llm, prompt)
        assert cached == 0
        times.append(t)
        _log(f"recompute {i + 1}/{repeats}: {t:.3f}s")
    return _median(times)


def _l2_hit(l2, prompt, repeats: int) -> tuple[float, int, int]:
    """Evict L1 down to host memory, then hit: (median TTFT, cached tokens, bytes read)."""
    _ttft(l2, prompt)
    times, byts, cached = [], [], 0
    for i in range(repeats):
        pool = l2.engine.pool
        l2.engine.cache.make_room(pool.full.allocator.capacity, pool.swa.allocator.capacity)
        before = l2.engine.cache.l2.bytes_read
        t, cached = _ttft(l2, prompt)
        times.append(t)
        byts.append(l2.engine.cache.l2.bytes_read - before)
        _log(f"L2 hit {i + 1}/{repeats}: {t:.3f}s, {cached} cached")
    return _median(times), cached, byts[-1]


def _l3_hit(make, name: str, prompt, warm, repeats: int, url: str, res: dict):
    """Write the prompt through to the store, then hit it from fresh engines."""
    writer = make()
    _ttft(writer, prompt)
    writer.engine.flush_tiers()
    writer.engine.close()
    times, cached, read = [], 0, 0
    for i in range(repeats):
        fresh = make()
        _ttft(fresh, warm)      # first-call costs (LM head bounds, threads) not timed
        fresh.engine.cache.l3.bytes_read = 0
        t, cached = _ttft(fresh, prompt)
        times.append(t)
        read = fresh.engine.cache.l3.bytes_read
        if name == "redis" and i == repeats - 1:
            res.update(_redis_load_vs_raw(fresh, prompt, url, max(repeats, 5)))
        fresh.engine.close()
        _log(f"{name} hit {i + 1}/{repeats}: {t:.3f}s, {cached} cached")
    return _median(times), cached, read


def _report(res: dict, hits: dict, layout, page: int) -> None:
    from ..kvcache.pool.layout import KVLayout
    from ..kvcache.radix.retention import window_pages
    full_kv = KVLayout(layout.full + layout.swa, (), layout.window, layout.dtype_bytes,
                       hybrid=False)
    for name, (t, cached, read) in hits.items():
        win = len(window_pages(cached, layout.window, page)) * page if layout.hybrid else 0
        minimum = layout.full_bytes_per_token * cached + layout.swa_bytes_per_token * win
        res[f"ttft_{name}_s"] = round(t, 4)
        res[f"ttft_{name}_vs_recompute"] = round(t / res["ttft_recompute_s"], 4)
        res[f"cached_{name}"] = cached
        res[f"bytes_{name}"] = read
        res[f"bytes_{name}_vs_min"] = round(read / max(minimum, 1), 4)
        res[f"bytes_{name}_vs_full_kv_tier"] = round(
            read / max(full_kv.full_bytes_per_token * cached, 1), 4)
    res["ttft_recompute_s"] = round(res["ttft_recompute_s"], 4)
    res["targets"] = {
        "l2_ttft_le_0.05x": res["ttft_l2_vs_recompute"] <= 0.05,
        "l3_ttft_le_0.1x": max(res["ttft_disk_vs_recompute"],
                               res["ttft_redis_vs_recompute"]) <= 0.1,
        "bytes_le_1.1x_min": max(res[f"bytes_{n}_vs_min"] for n in hits) <= 1.1,
        "redis_load_ge_0.7_raw": res["redis_load_vs_raw"] >= 0.7}


def run(args) -> int:
    import torch

    from ..llm import LLM
    from ..models import registry
    if args.threads:
        torch.set_num_threads(args.threads)
    _log(f"loading {args.model}")
    loaded = registry.load(args.model, progress=False)
    prompt = _prompt(loaded.tokenizer, args.prompt_tokens, loaded.config.vocab_size)
    warm = prompt[::-1][:32]                # shares no page with the prompt
    base = dict(dtype=args.dtype, kv_cache_memory=args.kv_cache_memory, progress=False,
                num_threads=args.threads, max_model_len=args.prompt_tokens + 64)
    redis_proc = None
    url = args.redis
    if url is None:
        from .redis_process import RedisServer
        try:
            redis_proc = RedisServer()
        except RuntimeError as e:
            raise SystemExit(f"{e}; or pass --redis URL") from None
        url = redis_proc.url
    disk = tempfile.mkdtemp(prefix="mimo-bench-kv-")
    res: dict = {"model": args.model, "prompt_tokens": args.prompt_tokens, "dtype": args.dtype}
    try:
        cold = LLM(args.model, loaded=loaded, **base)
        layout, page = cold.engine.pool.layout, cold.engine.pool.page_size
        res["ttft_recompute_s"] = _recompute(cold, prompt, warm, args.repeats)
        del cold
        hits = {"l2": _l2_hit(LLM(args.model, loaded=loaded,
                                  host_kv_cache_memory=args.host_kv_cache_memory, **base),
                              prompt, args.repeats)}
        for name, store in (("disk", f"file:{disk}"), ("redis", url)):
            hits[name] = _l3_hit(lambda s=store: LLM(args.model, loaded=loaded, kv_storage=s, **base),
                                 name, prompt, warm, args.repeats, url, res)
        _report(res, hits, layout, page)
    finally:
        if redis_proc is not None:
            redis_proc.stop()
        shutil.rmtree(disk, ignore_errors=True)
    print(json.dumps(res))
    return 0
