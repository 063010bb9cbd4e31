"""encoder: vision-encoder throughput and latency, cross-request batching off vs on.

Many concurrent clients (closed loop: each sends its next request when the last one is
answered) submit images of a few sizes to `mimo.stages.encode.EncodeStage` in front of a
Qwen2.5-VL vision tower with random weights. `off`: one forward per request
(max_batch_size=1). `on`: the stage packs every waiting request's patches into one forward
under a patch budget. Both modes run the same requests in one process, side by side.

The tower is Qwen2.5-VL-3B's at its real width (hidden 1280, 16 heads of 80, MLP 3420,
merger to 2048) but 4 layers deep instead of 32 (full attention on layer 3, as on every
fourth), so a laptop CPU runs it in seconds; `--depth 32` gives the real one. Requests are
small images (thumbnail sizes, 16-36 patches each) by default: on a CPU that is where
batching pays, since one small image's matmuls stream every weight for a few rows
(bandwidth-bound) while a batch reuses them; images of hundreds of patches are compute-bound
on a CPU already and gain little (`--sizes 224x224`). Patches are random: decoding and
resizing are the preprocess stage's cost, not the encoder's.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import torch

NAME = "encoder"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="vision encoder QPS / p90: batching off vs on",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--batching", default="off,on", help="modes to run: off, on, or off,on")
    p.add_argument("--requests", type=int, default=64, help="requests per mode")
    p.add_argument("--concurrency", type=int, default=16, help="clients sending at once")
    p.add_argument("--sizes", default="56x56,56x84,84x56,84x84",
                   help="image sizes in pixels (multiples of 28), cycled over requests")
    p.add_argument("--hidden", type=int, default=1280)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--intermediate", type=int, default=3420)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--out-hidden", type=int, default=2048, help="language model width")
    p.add_argument("--patch-budget", type=int, default=8192, help="patches per batched forward")
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    return p


def _encoder(args):
    from ..config import VisionConfig
    from ..models.qwen2_5_vl_vision import Qwen2_5_VisionTransformer
    from ..models.tiny.qwen2_5_vl import vision_weights
    full = tuple(i for i in range(args.depth) if i % 4 == 3)   # 7, 15, 23, 31 at depth 32
    shape = dict(depth=args.depth, hidden_size=args.hidden, intermediate_size=args.intermediate,
                 num_heads=args.heads, out_hidden_size=args.out_hidden, patch_size=14,
                 temporal_patch_size=2, spatial_merge_size=2, in_channels=3)
    vc = VisionConfig(**shape, fullatt_block_indexes=full, window_size=112)
    w = vision_weights(shape, torch.Generator().manual_seed(args.seed), prefix="visual.")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    return vc, Qwen2_5_VisionTransformer(vc, w, dtype).eval()


def _sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for s in text.split(","):
        h, w = (int(x) for x in s.lower().split("x"))
        if h % 28 or w % 28 or h <= 0 or w <= 0:
            raise ValueError(f"image size {s!r}: height and width must be positive multiples of 28")
        out.append((h, w))
    return out


async def _run_mode(stage, media, concurrency: int) -> tuple[float, list[float]]:
    from ..stages import ChatRequest
    queue = list(range(len(media)))
    latencies: list[float] = []

    async def client():
        while queue:
            i = queue.pop()
            req = ChatRequest(preprocessed=[media[i]])
            t0 = time.perf_counter()
            await stage.run(req)
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    await stage.close()
    return wall, latencies


def _p(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def run(args) -> int:
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)     # callers in-process (tests) keep their setting


def _run(args) -> int:
    from ..stages.encode import EncodeStage
    try:
        modes = [m.strip() for m in args.batching.split(",")]
        if not modes or set(modes) - {"off", "on"}:
            raise ValueError("--batching takes off, on or off,on")
        sizes = _sizes(args.sizes)
    except ValueError as e:
        print(f"{NAME}: {e}", file=sys.stderr)
        return 2
    vc, enc = _encoder(args)
    gen = torch.Generator().manual_seed(args.seed + 1)
    media = []
    for i in range(args.requests):
        h, w = sizes[i % len(sizes)]
        grid = (1, h // 14, w // 14)
        media.append({"pixel_values": torch.randn(grid[1] * grid[2], vc.patch_dim, generator=gen),
                      "grid_thw": grid})
    enc(media[0]["pixel_values"], [media[0]["grid_thw"]])      # warm up kernels and allocator
    res: dict = {"bench": NAME, "requests": args.requests, "concurrency": args.concurrency,
                 "sizes": args.sizes, "hidden": args.hidden, "depth": args.depth,
                 "heads": args.heads, "dtype": args.dtype, "threads": torch.get_num_threads()}
    for mode in modes:
        stage = EncodeStage(enc, patch_dim=vc.patch_dim, merge=vc.spatial_merge_size,
                            max_batch_size=1 if mode == "off" else 64,
                            max_batch_cost=args.patch_budget, max_wait_ms=args.max_wait_ms)
        print(f"[{NAME}] batching {mode}: {args.requests} requests, {args.concurrency} clients",
              file=sys.stderr, flush=True)
        wall, lat = asyncio.run(_run_mode(stage, media, args.concurrency))
        qps, p50, p90 = len(lat) / wall, _p(lat, 0.5), _p(lat, 0.9)
        print(f"[{NAME}] batching {mode}: {qps:.1f} req/s, p50 {p50 * 1e3:.0f} ms, "
              f"p90 {p90 * 1e3:.0f} ms ({wall:.1f} s)", file=sys.stderr, flush=True)
        res[mode] = {"qps": round(qps, 2), "p50_ms": round(p50 * 1e3, 1),
                     "p90_ms": round(p90 * 1e3, 1), "wall_s": round(wall, 2)}
    if "on" in res and "off" in res:
        res["qps_ratio"] = round(res["on"]["qps"] / res["off"]["qps"], 2)
        res["p90_ratio"] = round(res["on"]["p90_ms"] / res["off"]["p90_ms"], 2)
    for mode in modes:
        r = res[mode]
        print(f"batching {mode}: QPS {r['qps']}, p90 {r['p90_ms']} ms")
    print(json.dumps(res), flush=True)
    return 0
