"""encode: the vision encoder as a BatchStage. The patches of many requests' images and videos
go through one encoder forward under a patch budget; the embeddings come back split per
request and per item.

Why batch: an encoder forward over one small image is many small matmuls plus fixed per-layer
overhead; packing several requests' items into one forward (no padding: the encoder attends
block-diagonally per item and window) makes the matmuls large enough to run efficiently, so
throughput rises, and under load each request waits for one batched forward rather than for
everybody ahead of it one by one.

Input: `req.preprocessed`, a list of media items, each the preprocess stage's
`PreprocessedMedia` (its `patches` hold `pixel_values` [patches, patch_dim] and `grid_thw`
(t, h, w) in patches, its `key` is the embedding-cache key) or a mapping or object with
`pixel_values` and `grid_thw` (no cache key). Output (`req.embeds`): one embedding tensor
per item, in order.

Embedding cache: with `cache` set, items whose key is cached skip the encoder; the misses
of a batch are encoded once per distinct key (two requests sending the same picture at the
same time share one encoding) and stored. Keys carry the request's cache salt: requests
under different salts never share an encoding. `forwards` counts encoder calls, so a test or
/metrics can see that a hit really skipped the encoder.

Encoder workers: with `pool` (an EncoderPool, or remote encoders: multimodal/remote_encoders.py)
the items go to worker processes instead, each the owner of the keys the hash ring gives
it, with its own cache; the workers of a batch run at the same time, and their hit, miss
and forward counts add up here. A request with an `embed_hit` field gets, per item, whether
a cache served it (an encoder worker reports it to its caller).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..multimodal.embed_cache import EmbedCache, salted_key
from ..pipeline import BatchStage, InvalidRequest


def _field(item: Any, name: str):
    return item[name] if isinstance(item, dict) else getattr(item, name)


def _items(req) -> list[tuple[torch.Tensor, tuple[int, int, int]]]:
    media = req.preprocessed or []
    out = []
    for item in media:
        src = getattr(item, "patches", item)      # PreprocessedMedia wraps its Patches
        px = _field(src, "pixel_values")
        t, h, w = (int(x) for x in torch.as_tensor(_field(src, "grid_thw")).reshape(3).tolist())
        out.append((px, (t, h, w)))
    return out


def _keys(req) -> list[str | None]:
    """Each item's embedding-cache key, salted by the request's cache salt."""
    scope = getattr(req, "cache", None)
    salt = getattr(scope, "salt", None)
    return [None if (k := getattr(item, "key", None)) is None else salted_key(k, salt)
            for item in req.preprocessed or []]


def _record_hits(req, hit: list[bool]) -> None:
    if hasattr(req, "embed_hit"):
        req.embed_hit = hit


class EncodeStage(BatchStage):
    """`encoder(pixel_values, grid_thw) -> embeddings` runs many items at once, returning their
    embeddings concatenated in item order (the vision adapter's `encoder(model)`);
    each item yields t*h*w / merge**2 rows. `max_batch_cost` is the patch budget of one
    forward (a request larger than it runs alone)."""
    name = "encode"
    max_batch_size = 64
    max_batch_cost: float = 16384
    max_wait_ms = 2.0

    def __init__(self, encoder: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *,
                 patch_dim: int, merge: int = 2, name: str | None = None, max_batch_size: int | None = None,
                 max_batch_cost: float | None = None, max_wait_ms: float | None = None,
                 cache: EmbedCache | None = None, pool=None):
        super().__init__(name)
        self.encoder = encoder
        self.cache = cache
        self.pool = pool
        self.forwards = 0          # encoder calls made (a cache hit makes none)
        self._pool_hits = self._pool_misses = 0
        self.patch_dim = patch_dim
        self.merge = merge
        if max_batch_size is not None:
            self.max_batch_size = max_batch_size
        if max_batch_cost is not None:
            self.max_batch_cost = max_batch_cost
        if max_wait_ms is not None:
            self.max_wait_ms = max_wait_ms

    def cost(self, req) -> float:
        try:
            return float(sum(t * h * w for _, (t, h, w) in _items(req)))
        except Exception:
            return 1.0     # malformed: process_batch reports it for this request alone

    def _check(self, items) -> None:
        m = self.merge
        for i, (px, (t, h, w)) in enumerate(items):
            if t < 1 or h % m or w % m or h < m or w < m:
                raise InvalidRequest(f"media item {i}: grid {(t, h, w)} must be positive with "
                                     f"h and w multiples of {m}")
            if px.dim() != 2 or px.shape != (t * h * w, self.patch_dim):
                raise InvalidRequest(f"media item {i}: pixel_values {tuple(px.shape)} do not "
                                     f"match grid {(t, h, w)} x {self.patch_dim}")

    async def process_batch(self, reqs) -> Sequence[Any]:
        results: list[Any] = [None] * len(reqs)
        work = []                  # (request index, its items)
        for i, req in enumerate(reqs):
            try:
                items = _items(req)
                self._check(items)
            except Exception as e:    # fails this request alone, keeping what it was
                results[i] = e
                continue
            if req.cancelled:
                results[i] = []    # its answer is dropped; skip the work
            elif not items:
                results[i] = []
            else:
                work.append((i, items))
        if work:
            await self._encode(reqs, work, results)
        for req, r in zip(reqs, results):
            if isinstance(r, list):
                req.embeds = r
        return results

    @property
    def cache_hits(self) -> int:
        return self._pool_hits if self.pool else self.cache.stats.hits if self.cache else 0

    @property
    def cache_misses(self) -> int:
        return self._pool_misses if self.pool else self.cache.stats.misses if self.cache else 0

    async def close(self) -> None:
        await super().close()
        if self.pool is not None:
            await asyncio.to_thread(self.pool.close)
        close = getattr(self.cache, "close", None)     # detach a shared segment
        if close is not None:
            close()

    async def _encode_pool(self, reqs, work, results) -> None:
        """Route every item by its key; one call per worker, all workers at once."""
        by_worker: dict[str, list[tuple[int, int, str, Any]]] = {}
        for i, items in work:
            for j, (item, key) in enumerate(zip(items, _keys(reqs[i]))):
                if key is None:
                    raise InvalidRequest("encoder workers need media with cache keys")
                by_worker.setdefault(self.pool.route(key), []).append((i, j, key, item))
        workers = list(by_worker)
        replies = await asyncio.gather(*(asyncio.to_thread(
            self.pool.encode, w, [k for *_, k, _ in by_worker[w]],
            [it for *_, it in by_worker[w]]) for w in workers))
        out = {i: [None] * len(items) for i, items in work}
        hit = {i: [False] * len(items) for i, items in work}
        for w, reply in zip(workers, replies):
            self._pool_hits += reply.hits
            self._pool_misses += reply.misses
            self.forwards += reply.forwarded
            for (i, j, _, _), emb, h in zip(by_worker[w], reply.embeds, reply.hit):
                out[i][j], hit[i][j] = emb, h
        for i, _ in work:
            results[i] = out[i]
            _record_hits(reqs[i], hit[i])

    async def _encode(self, reqs, work, results) -> None:
        """Fill results[i] for each (i, items) of `work`: cached embeddings where the cache
        has them, one encoder forward over the distinct missing items for the rest."""
        if self.pool is not None:
            return await self._encode_pool(reqs, work, results)
        out: dict[int, list[torch.Tensor | None]] = {}
        made: dict[Any, torch.Tensor] = {}
        todo: dict[Any, tuple[torch.Tensor, tuple[int, int, int]]] = {}   # key -> item
        for i, items in work:
            keys = _keys(reqs[i]) if self.cache is not None else [None] * len(items)
            out[i] = []
            for j, (item, key) in enumerate(zip(items, keys)):
                hit = self.cache.get(key) if self.cache is not None and key is not None else None
                out[i].append(hit)
                if hit is None:
                    todo.setdefault(key if key is not None else (i, j), item)
        if todo:
            px = torch.cat([p for p, _ in todo.values()])
            grids = torch.tensor([g for _, g in todo.values()])
            self.forwards += 1
            embeds = await asyncio.to_thread(self._forward, px, grids)
            sizes = [t * h * w // self.merge ** 2 for t, h, w in grids.tolist()]
            made = dict(zip(todo, torch.split(embeds, sizes)))
            if self.cache is not None:
                for key, emb in made.items():
                    if isinstance(key, str):
                        self.cache.put(key, emb.clone())    # not a view pinning the batch
        for i, items in work:
            keys = _keys(reqs[i]) if self.cache is not None else [None] * len(items)
            _record_hits(reqs[i], [e is not None for e in out[i]])
            results[i] = [e if e is not None else made[k if k is not None else (i, j)]
                          for j, (e, k) in enumerate(zip(out[i], keys))]

    def _forward(self, px: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
        # inference_mode is per thread: set it in the worker thread the forward runs on.
        with torch.inference_mode():
            return self.encoder(px, grids)
