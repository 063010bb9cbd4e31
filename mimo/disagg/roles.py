"""Worker roles (`server.py --role`): what each adds to a server.

    both      prefill and decode in one worker: today's server, nothing added
    prefill   POST /v1/internal/prefill (`PrefillEndpoint`): a prompt's KV and first token,
              streamed to the decode worker that asks; it still serves the OpenAI API whole
    decode    requests naming a prefill worker (the router's x-mimo-prefill header) take
              their prompt's KV from it (`DecodeGenerate`); others run here whole
    encoder   the vision tower only (api/encoder_server.py, run by server.py instead of an engine)

Both PD roles serve GET /v1/internal/kv_transfers: their transfer counters as JSON. Two
workers exchange KV only under the same `kv_fingerprint` (model, dtype, KV layout, page
size); speculative decoding and media prompts are not split yet (refused / run whole).
"""
from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.routing import Route

from ..config import ConfigError, ServerConfig
from ..engine.async_engine import AsyncEngine
from ..kvcache.pool.layout import KVLayout
from .decode_generate import DecodeGenerate
from .prefill_client import PrefillClient
from .prefill_endpoint import PrefillEndpoint

ROLES = ("both", "prefill", "decode", "encoder")


def kv_fingerprint(engine: AsyncEngine) -> str:
    """Same weights, KV layout, page size and dtype (the engine's KV identity, as the tiers
    key it): KV one worker computed is valid on the other."""
    return engine.info.fingerprint.hex()


def kv_layout(engine: AsyncEngine) -> KVLayout:
    """The layout of the engine's pools (hybrid unless its window is 0: full-kv)."""
    info = engine.info
    return KVLayout.from_model(info.model_config, info.dtype,
                               "hybrid" if info.window else "full-kv")


def decode_stage(cfg: ServerConfig, engine: AsyncEngine) -> DecodeGenerate | None:
    """The generate stage of a decode worker (None for the other roles)."""
    _check(cfg, engine)
    if cfg.role != "decode":
        return None
    client = PrefillClient(kv_fingerprint(engine), kv_layout(engine), engine.info.page_size,
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
        endpoint = PrefillEndpoint(server, kv_fingerprint(server.engine),
                                   kv_layout(server.engine))
        routes.append(Route("/v1/internal/prefill", endpoint.handle, methods=["POST"]))

    async def stats(request):
        st = server.engine.stats
        free = [(p["free"] + p["evictable"]) / p["capacity"] for p in st.pools.values()
                if p.get("capacity")]
        out: dict = {"role": cfg.role, "load": {"waiting": st.waiting, "running": st.running,
                                                 "kv_free": min(free) if free else 1.0}}
        if endpoint is not None:
            out["sent"] = endpoint.stats.as_dict()
        if stage is not None:
            out["received"] = stage.client.stats.as_dict()
            out["received"]["recomputed"] = stage.recomputed
            # the engine's side: admitted on transferred KV, or run here after all
            out["received"]["imported"] = st.kv_imported
            out["received"]["import_recomputed"] = st.kv_import_recomputed
        return JSONResponse(out)
    routes.append(Route("/v1/internal/kv_transfers", stats, methods=["GET"]))
    return routes


def _check(cfg: ServerConfig, engine: AsyncEngine) -> None:
    if cfg.role not in ROLES:
        raise ConfigError(f"role must be one of {', '.join(ROLES)}, not {cfg.role!r}")
    if cfg.role != "both" and engine.info.speculative is not None:
        raise ConfigError("--role prefill/decode: speculative decoding is not split between "
                          "workers yet (drop --speculative)")
