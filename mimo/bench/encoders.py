"""encoders: embedding-cache hit rate across encoder worker processes, hashing against
round-robin, with the shared-memory cache off and on, on repeated media.

Starts `--encoders` real `server.py --role encoder` processes on loopback (a tiny random
Qwen2.5-VL by default: the cache, not the tower, is measured) and drives them with the
client a worker uses (`RemoteEncoders`, the same routing and wire). The workload: `--media`
distinct images (random patches, one (1, 8, 8) grid each), `--requests` requests of one
image each drawn from a Zipf(`--zipf`) popularity, the same sequence for every
configuration but under fresh keys, so no run sees another's entries. Each encoder's own
cache holds `--local-items` items (`--embed-cache-bytes`); with the shared cache on, all of
them sit in front of one `--shm-mb` segment. The hit rate is the fraction of items served
from a cache (own or shared), as the encoders report it per item; `forwards` is the number
of calls that ran the tower, `sent_mb` the request bytes on the wire (a probe by key
first: only misses send their patches). Ends with one JSON line (the CPU and its flags included).
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
import uuid
from pathlib import Path

NAME = "encoders"
GRID = (1, 8, 8)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="encoder cache hit rate: hash vs round-robin, "
                                         "shared-memory cache off vs on",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None,
                   help="a Qwen2.5-VL directory (default: a tiny random one, written here)")
    p.add_argument("--encoders", type=int, default=3, help="encoder processes")
    p.add_argument("--media", type=int, default=300, help="distinct images")
    p.add_argument("--requests", type=int, default=1500, help="requests (one image each)")
    p.add_argument("--zipf", type=float, default=0.8, help="popularity skew")
    p.add_argument("--local-items", type=int, default=40,
                   help="items each encoder's own cache holds")
    p.add_argument("--shm-mb", type=int, default=64, help="shared cache size when on")
    p.add_argument("--seed", type=int, default=0)
    return p


def _model(args, tmp: Path) -> Path:
    if args.model:
        return Path(args.model)
    from ..models.tiny import qwen2_5_vl
    qwen2_5_vl.write(tmp, seed=3)
    return tmp


def _item_bytes(model: Path) -> tuple[int, int]:
    """(bytes of one item's float32 embeddings, patch dim) from the checkpoint's config."""
    vc = json.loads((model / "config.json").read_text())["vision_config"]
    merge = vc.get("spatial_merge_size", 2)
    t, h, w = GRID
    rows = t * h * w // merge ** 2
    patch_dim = vc.get("in_chans", vc.get("in_channels", 3)) * vc.get("temporal_patch_size", 2) \
        * vc.get("patch_size", 14) ** 2
    return rows * vc["out_hidden_size"] * 4, patch_dim


def _start(model: Path, n: int, cache_bytes: int, shm: tuple[str, int] | None):
    from .server_process import ServerProcess
    flags = ["--role", "encoder", "--model", str(model), "--dtype", "float32", "--threads", "1",
             "--embed-cache-bytes", str(cache_bytes)]
    if shm is not None:
        flags += ["--encoder-shm-name", shm[0], "--encoder-shm-cache-mb", str(shm[1])]
    procs: list = []
    try:        # one after the other: parallel starts could pick the same free port
        for _ in range(n):
            procs.append(ServerProcess(flags, start_timeout=300))
    except BaseException:
        for p in procs:
            p.stop()
        raise
    return procs


def _run(procs, routing: str, sequence: list[int], pixels, run_id: str) -> dict:
    import httpx
    import torch

    from ..multimodal.remote_encoders import RemoteEncoders
    fp = httpx.get(procs[0].url + "/v1/internal/encoder").json()["fingerprint"]
    enc = RemoteEncoders([p.url for p in procs], fp, torch.float32, 2, routing)
    hits = forwards = 0
    t0 = time.perf_counter()
    try:
        for m in sequence:
            key = f"{run_id}-media-{m}"
            reply = enc.encode(enc.route(key), [key], [(pixels[m % len(pixels)], GRID)])
            hits += reply.hits
            forwards += reply.forwarded
        sent = enc.bytes_sent
    finally:
        enc.close()
    return {"routing": routing, "hit_rate": round(hits / len(sequence), 4), "hits": hits,
            "forwards": forwards, "sent_mb": round(sent / 2**20, 2),
            "seconds": round(time.perf_counter() - t0, 2)}


def run(args) -> int:
    import torch

    from ..cpu.features import cpu_info
    rng = random.Random(args.seed)
    weights = [1 / (i + 1) ** args.zipf for i in range(args.media)]
    sequence = rng.choices(range(args.media), weights, k=args.requests)
    distinct = len(set(sequence))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model = _model(args, Path(tmp))
        item_bytes, patch_dim = _item_bytes(model)
        g = torch.Generator().manual_seed(args.seed)
        pixels = [torch.randn(GRID[0] * GRID[1] * GRID[2], patch_dim, generator=g)
                  for _ in range(8)]    # contents do not matter to the cache: keys do
        for shm_on in (False, True):
            shm = (f"mimo-bench-{uuid.uuid4().hex[:8]}", args.shm_mb) if shm_on else None
            procs = _start(model, args.encoders, args.local_items * item_bytes, shm)
            try:
                for routing in ("hash", "round-robin"):
                    r = _run(procs, routing, sequence, pixels, uuid.uuid4().hex[:8])
                    r["shm"] = shm_on
                    results.append(r)
                    print(f"shm {'on ' if shm_on else 'off'} {routing:11s} hit rate "
                          f"{r['hit_rate']:.3f}  forwards {r['forwards']:5d}  sent "
                          f"{r['sent_mb']:.1f} MB  {r['seconds']:.1f} s", flush=True)
            finally:
                for p in procs:
                    p.stop()
    by = {(r["shm"], r["routing"]): r["hit_rate"] for r in results}
    info = cpu_info()
    print(json.dumps({
        "bench": NAME, "encoders": args.encoders, "media": args.media,
        "requests": args.requests, "distinct_requested": distinct, "zipf": args.zipf,
        "local_items": args.local_items, "shm_mb": args.shm_mb,
        "best_possible_hit_rate": round(1 - distinct / args.requests, 4),
        "hit_rate": {f"{'shm' if s else 'no_shm'}_{k}": v for (s, k), v in by.items()},
        "hash_gain_no_shm": round(by[(False, "hash")] / max(by[(False, "round-robin")], 1e-9)
                                  - 1, 3),
        "runs": results, "cpu": info.model, "cpu_flags": sorted(info.flags)}))
    return 0
