"""Worker roles (`server.py --role`): what each adds to a server.

    both      prefill and decode in one worker: today's server, nothing added
    prefill   POST /v1/internal/prefill (`PrefillEndpoint`): a prompt's KV and first token,
              streamed to the decode worker that asks; it still serves the OpenAI API whole
    decode    requests naming a prefill worker (the router's x-mimo-prefill header) take
              their prompt's KV from it (`DecodeGenerate`); others run here whole

Both PD roles serve GET /v1/internal/kv_transfers: their transfer counters as JSON. Two
workers exchange KV only under the same `kv_fingerprint` (model, dtype, KV layout, page
size); speculative decoding and media prompts are not split yet (refused / run whole).
"""
from __future__ import annotations

import hashlib
import json

from starlette.responses import JSONResponse
from starlette.routing import Route

from ..config import ConfigError, ServerConfig
from ..engine.async_engine import AsyncEngine
from .decode_generate import DecodeGenerate
from .prefill_client import PrefillClient
from .prefill_endpoint import PrefillEndpoint

ROLES = ("both", "prefill", "decode")


def kv_fingerprint(engine: AsyncEngine) -> str:
    """Same model, numerics and KV paging: KV one worker computed is valid on the other."""
    eng = engine.engine
    rt, pool = eng.config.runtime, eng.pool
    key = [eng.config.model, eng.model_config.arch, rt.dtype, repr(pool.layout),
           pool.page_size]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]


def decode_stage(cfg: ServerConfig, engine: AsyncEngine) -> DecodeGenerate | None:
    """The generate stage of a decode worker (None for the other roles)."""
    _check(cfg, engine)
    if cfg.role != "decode":
        return None
    eng = engine.engine
    client = PrefillClient(kv_fingerprint(engine), eng.pool.layout, eng.pool.page_size,
                           cfg.kv_transfer_timeout, cfg.api_key)
    return DecodeGenerate(engine, client)


def role_routes(server, stage: DecodeGenerate | None) -> list[Route]:
    """The routes `server` (an api.app.Server) adds for its role."""
    cfg = server.cfg
    if cfg.role == "both":
        return []
    routes = []
    endpoint = None
    if cfg.role == "prefill":
        endpoint = PrefillEndpoint(server, kv_fingerprint(server.engine))
        routes.append(Route("/v1/internal/prefill", endpoint.handle, methods=["POST"]))

    async def stats(request):
        out: dict = {"role": cfg.role}
        if endpoint is not None:
            out["sent"] = endpoint.stats.as_dict()
        if stage is not None:
            out["received"] = stage.client.stats.as_dict()
            out["received"]["recomputed"] = stage.recomputed
            out["imported"] = server.engine.engine.transfers.imported
        return JSONResponse(out)
    routes.append(Route("/v1/internal/kv_transfers", stats, methods=["GET"]))
    return routes


def _check(cfg: ServerConfig, engine: AsyncEngine) -> None:
    if cfg.role not in ROLES:
        raise ConfigError(f"role must be one of {', '.join(ROLES)}, not {cfg.role!r}")
    if cfg.role != "both" and engine.engine.config.spec.enabled:
        raise ConfigError("--role prefill/decode: speculative decoding is not split between "
                          "workers yet (drop --speculative)")
