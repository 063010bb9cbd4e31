"""The encoder role (`server.py --role encoder`): a worker that only runs the vision tower.

Routes (`--api-key` guards the internal ones):
    GET  /health
    POST /v1/internal/encode    encoder_wire frames both ways: preprocessed patches and
                                their cache keys in, embeddings out (200), or a probe:
                                keys in, the cached ones' embeddings out; 400 for a frame
                                or items the tower cannot take, 401 without the key, 409
                                when the caller expects another tower (fingerprint), 413
                                over the size bound; errors in OpenAI's JSON shape
    GET  /v1/internal/encoder   JSON: fingerprint, requests, items, hits, misses, forwards,
                                and the shared-memory cache's counters when it is on

Requests that arrive together go through one forward: the EncodeStage a colocated server
runs (cross-request batching under a patch budget, the cache first, each distinct missing
key encoded once). Its cache is this process's LRU (`--embed-cache-bytes`) in front of the
machine's shared segment (`--encoder-shm-cache-mb`); `--encoder-workers N` runs N tower
processes here instead, routed by the hash ring, each with its cache in front of the same
segment.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..config import ConfigError, ServerConfig
from ..multimodal import encoder_wire as ew
from ..multimodal.adapter import adapter_for
from ..multimodal.embed_store import ShmSpec, make_embed_cache, tower_fingerprint
from ..multimodal.encoder_pool import EncoderPool
from ..multimodal.preprocess import Patches
from ..multimodal.preprocessed import PreprocessedMedia
from ..pipeline import Request
from ..stages import EncodeStage
from .body import read_bytes
from .errors import APIError, Unauthorized, bad_request, error_response

log = logging.getLogger("mimo.api")
MAX_ENCODE_BODY = 1 << 30       # patches are float32: a 12 MP image is about 77 MB


@dataclass(eq=False, kw_only=True)
class EncodeJob(Request):
    preprocessed: list[PreprocessedMedia]
    embeds: list[torch.Tensor] = field(default_factory=list)     # encode
    embed_hit: list[bool] = field(default_factory=list)          # encode


def shm_spec(cfg: ServerConfig) -> ShmSpec | None:
    if not cfg.encoder_shm_cache_mb:
        return None
    return ShmSpec(cfg.encoder_shm_name, cfg.encoder_shm_cache_mb * 2**20)


class EncoderWorker:
    def __init__(self, cfg: ServerConfig, model: str, dtype: str, device: str = "cpu"):
        from ..models import registry
        if cfg.encoder_urls:
            raise ConfigError("--role encoder runs the tower itself: drop --encoder-worker")
        self.cfg = cfg
        loaded = registry.load(model, progress=False)
        adapter = adapter_for(loaded.config)
        if adapter is None:
            raise ConfigError(f"--role encoder: model {model!r} has no vision tower")
        tdtype = getattr(torch, dtype)
        self.cache: Any = None
        pool = None
        encoder: Any = None
        if cfg.encoder_workers == 1:
            tower = adapter.build_tower(loaded.weights, tdtype).to(device)
            del loaded
            self.fingerprint = tower_fingerprint(tower, dtype)
            self.cache = make_embed_cache(cfg.embed_cache_bytes, shm_spec(cfg), self.fingerprint)

            def encoder(px, grids):
                return tower(px.to(device), grids)
        else:
            del loaded
            threads = max(1, torch.get_num_threads() // cfg.encoder_workers)
            pool = EncoderPool(model, cfg.encoder_workers, tdtype, cfg.embed_cache_bytes,
                               threads, shm_spec(cfg))
            self.fingerprint = pool.fingerprint
        self.stage = EncodeStage(encoder, patch_dim=adapter.patch_dim, merge=adapter.merge,
                                 cache=self.cache, pool=pool)
        self.requests = self.items = 0

    def _require_key(self, request) -> None:
        key = self.cfg.api_key
        if key and not hmac.compare_digest(request.headers.get("authorization", ""),
                                           f"Bearer {key}"):
            raise Unauthorized("the encoder worker's --api-key")

    async def encode(self, request) -> Response:
        try:
            self._require_key(request)
            body = await read_bytes(request, MAX_ENCODE_BODY, self.cfg.body_read_timeout)
            try:
                fp, items = ew.decode_request(body)
            except ew.WireError as e:
                raise bad_request(f"malformed encode request: {e}") from None
            if fp != self.fingerprint:
                raise APIError(409, f"this encoder serves tower {self.fingerprint[:16]}, "
                                    f"not {fp[:16]}", code="encoder_mismatch")
            if items[0].pixels is None:
                reply = await asyncio.to_thread(self._probe, [it.key for it in items])
                return Response(ew.encode_reply(reply), media_type=ew.CONTENT_TYPE)
            job = EncodeJob(preprocessed=[
                PreprocessedMedia("image", it.key, Patches(it.pixels, it.grid), None)
                for it in items if it.pixels is not None])
            await self.stage.run(job)       # a StageError maps to 400 (bad items) or 500
            self.requests += 1
            self.items += len(items)
            reply = ew.EncodeReply(self.fingerprint, job.embed_hit, job.embeds)
            return Response(ew.encode_reply(reply), media_type=ew.CONTENT_TYPE)
        except Exception as e:  # noqa: BLE001 - mapped to HTTP in the one place
            return error_response(e)

    def _probe(self, keys: list[str]) -> ew.EncodeReply:
        """Cached embeddings only (a miss is not counted: the pixels follow). With tower
        processes (--encoder-workers N) their caches are theirs: every item is a miss."""
        out = []
        for k in keys:
            e = self.cache.get(k) if self.cache is not None and k in self.cache else None
            out.append(e)
        self.requests += 1
        self.items += sum(e is not None for e in out)
        empty = torch.empty(0, 0)
        return ew.EncodeReply(self.fingerprint, [e is not None for e in out],
                              [e if e is not None else empty for e in out])

    async def stats(self, request) -> Response:
        try:
            self._require_key(request)
        except Unauthorized as e:
            return error_response(e)
        st = self.stage
        out: dict[str, Any] = {
            "role": "encoder", "fingerprint": self.fingerprint, "requests": self.requests,
            "items": self.items, "hits": st.cache_hits, "misses": st.cache_misses,
            "forwards": st.forwards}
        shared = getattr(self.cache, "shared", None)
        if shared is not None:
            out["shm"] = {**shared.shared_stats(), "name": shared.name,
                          "hits_here": self.cache.shared_hits}
        return JSONResponse(out)

    async def health(self, request) -> Response:
        return JSONResponse({"status": "ok", "role": "encoder"})

    async def close(self) -> None:
        await self.stage.close()        # closes the pool and detaches the shared segment


def build_encoder_app(worker: EncoderWorker) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        try:
            yield
        finally:
            await worker.close()
    return Starlette(routes=[
        Route("/health", worker.health, methods=["GET"]),
        Route("/v1/internal/encode", worker.encode, methods=["POST"]),
        Route("/v1/internal/encoder", worker.stats, methods=["GET"]),
    ], lifespan=lifespan)


def encoder_worker(args, cfg: ServerConfig) -> EncoderWorker:
    """The encoder role's worker from server.py's flags (--model, --dtype, --device,
    --threads and the media/encoder flags; the engine's KV and scheduler flags do not
    apply to it)."""
    from ..config.runtime import RuntimeConfig
    if args.threads:
        torch.set_num_threads(args.threads)
    rt = RuntimeConfig(device=args.device, dtype=args.dtype)
    return EncoderWorker(cfg, args.model, rt.dtype, rt.device)


def serve_encoder(worker: EncoderWorker, log_level: str = "info") -> int:
    import uvicorn
    cfg = worker.cfg
    log.info("encoder worker (tower %s) on http://%s:%d", worker.fingerprint[:16], cfg.host,
             cfg.port)
    uvicorn.run(build_encoder_app(worker), host=cfg.host, port=cfg.port, log_level=log_level,
                access_log=log_level == "debug", timeout_graceful_shutdown=2)
    return 0
