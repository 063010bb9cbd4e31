"""The router's flags and its frozen config (one field per flag)."""
from __future__ import annotations

import argparse
import uuid
from dataclasses import dataclass, field

from ..config import ConfigError


@dataclass(frozen=True)
class RouterConfig:
    workers: tuple[str, ...] = ()
    prefill: tuple[str, ...] = ()       # prefill workers (server.py --role prefill)
    decode: tuple[str, ...] = ()        # decode workers (--role decode), paired with them
    redis: str | None = None            # redis://... or redis-cluster://...; None: local only
    host: str = "127.0.0.1"
    port: int = 8100
    model: str | None = "gemma-3-270m"  # the workers' model, for its tokenizer and template
    image_max_pixels: int | None = None  # the workers' --image-max-pixels (media prompts' keys)
    match_weight: float = 1.0
    continuation_weight: float = 2.0    # on top, for a request continuing one on the worker
    l2_credit: float = 0.8              # a page a worker's host tier holds, vs its tree's 1
    l3_credit: float = 0.5              # a page the shared store holds (every worker on it)
    load_token_unit: int = 4096         # heartbeat uncached tokens per unit of load
    health_interval: float = 1.0
    retries: int = 2                    # other workers tried when one fails before a byte
    fallback_pages: int = 4             # pages hashed when Redis is away
    redis_timeout: float = 0.5
    request_timeout: float = 600.0
    policy: str = "cache-aware"         # or round-robin (the benchmark's baseline)
    router_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self):
        if self.policy not in ("cache-aware", "round-robin"):
            raise ConfigError(f"policy must be cache-aware or round-robin, not {self.policy!r}")
        if not (0 <= self.l2_credit <= 1 and 0 <= self.l3_credit <= 1):
            raise ConfigError("l2_credit and l3_credit must lie in [0, 1]")
        if not (self.match_weight >= 0 and self.continuation_weight >= 0):
            raise ConfigError("match_weight and continuation_weight must be >= 0")
        if self.image_max_pixels is not None and self.image_max_pixels <= 0:
            raise ConfigError("image_max_pixels must be > 0")
        if self.retries < 0 or self.fallback_pages < 1 or self.load_token_unit < 1:
            raise ConfigError("retries >= 0, fallback_pages >= 1, load_token_unit >= 1")
        if not (self.health_interval > 0 and self.redis_timeout > 0 and self.request_timeout > 0):
            raise ConfigError("health_interval, redis_timeout and request_timeout must be > 0")
        for w in self.workers + self.prefill + self.decode:
            if not w.startswith(("http://", "https://")):
                raise ConfigError(f"worker {w!r} is not an http(s):// URL")
        if bool(self.prefill) != bool(self.decode):
            raise ConfigError("--prefill and --decode come together: a prefill worker needs "
                              "a decode worker to hand its KV to, and the other way round")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mimo.router",
        description="Cache-aware OpenAI-compatible router in front of mimo servers. Workers "
                    "started with --router-redis publish what their prefix caches hold and "
                    "their load; the router predicts each worker's window-safe cached length "
                    "for a request and picks the highest match_weight * cached_fraction - "
                    "normalized_load. Router replicas on one Redis route alike.")
    p.add_argument("--worker", action="append", default=[], metavar="URL",
                   help="a worker's base URL, e.g. http://127.0.0.1:8001 (repeatable; workers "
                        "publishing to --redis join by themselves; POST/DELETE "
                        "/router/workers changes the set at run time)")
    p.add_argument("--prefill", action="append", default=[], metavar="URL",
                   help="a prefill worker (server.py --role prefill; repeatable): requests "
                        "are paired, prefill here (chosen by the cache-aware score), decode "
                        "on a --decode worker (chosen by load and free KV), the KV moving "
                        "between them (docs/disaggregation.md)")
    p.add_argument("--decode", action="append", default=[], metavar="URL",
                   help="a decode worker (server.py --role decode; repeatable)")
    p.add_argument("--redis", default=None, metavar="URL",
                   help="shared router state: redis://HOST:PORT[/DB] or "
                        "redis-cluster://HOST:PORT[,...] (default: none, consistent hashing "
                        "on the prompt's first pages)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8100, help="port to listen on (default 8100)")
    p.add_argument("--model", default="gemma-3-270m",
                   help="the workers' model (built-in name, .gguf or HF directory): the router "
                        "tokenizes prompts with its tokenizer and chat template")
    p.add_argument("--image-max-pixels", type=int, default=None, metavar="N",
                   help="the workers' --image-max-pixels, if they set one: a vision-language "
                        "model's image prompts are keyed by the patch grid it gives "
                        "(default: the checkpoint's bound)")
    p.add_argument("--match-weight", type=float, default=1.0,
                   help="weight of the predicted cached fraction against normalized load "
                        "(default 1: a worker with one mean load + 1 more requests in "
                        "flight than another must hold the whole prompt more to win)")
    p.add_argument("--continuation-weight", type=float, default=2.0, metavar="W",
                   help="further weight of the fraction on a worker where the request "
                        "continues an earlier one (its prompt runs through that one's end, "
                        "marked for 5 minutes): a conversation's history is recomputed in "
                        "full elsewhere, while a merely shared prefix (a system prompt) is "
                        "worth copying to a less loaded worker (default 2; 1: off)")
    p.add_argument("--l2-credit", type=float, default=0.8, metavar="W",
                   help="credit of a prompt page the worker holds in its host-memory tier "
                        "(L2), against 1 for one in its device cache: loading it costs a "
                        "copy (default 0.8)")
    p.add_argument("--l3-credit", type=float, default=0.5, metavar="W",
                   help="credit of a prompt page held in the shared KV store (L3) the "
                        "worker loads from, for every worker on that store: loading costs a "
                        "round trip, and the router learns the store's evictions only from "
                        "misses (default 0.5)")
    p.add_argument("--load-token-unit", type=int, default=4096, metavar="TOKENS",
                   help="uncached tokens queued on a worker that weigh as one in-flight "
                        "request in its load (default 4096)")
    p.add_argument("--health-interval", type=float, default=1.0, metavar="SECONDS",
                   help="seconds between /health checks of each worker")
    p.add_argument("--retries", type=int, default=2,
                   help="other workers tried for a request whose worker failed before "
                        "sending a byte, and to resume a deterministic stream (default 2)")
    p.add_argument("--fallback-pages", type=int, default=4,
                   help="leading prompt pages hashed to pick a worker while Redis is away")
    p.add_argument("--redis-timeout", type=float, default=0.5, metavar="SECONDS",
                   help="deadline of the state reads for one decision; past it the router "
                        "decides locally (default 0.5)")
    p.add_argument("--request-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="longest a worker may take to answer (default 600)")
    p.add_argument("--policy", default="cache-aware", choices=["cache-aware", "round-robin"],
                   help="cache-aware (default) or round-robin (a baseline)")
    p.add_argument("--router-id", default=None,
                   help="this replica's id in Redis (default: a random one per start)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def router_config(a: argparse.Namespace) -> RouterConfig:
    extra = {"router_id": a.router_id} if a.router_id else {}
    return RouterConfig(workers=tuple(w.rstrip("/") for w in a.worker), redis=a.redis,
                        prefill=tuple(w.rstrip("/") for w in a.prefill),
                        decode=tuple(w.rstrip("/") for w in a.decode),
                        host=a.host, port=a.port, model=a.model, image_max_pixels=a.image_max_pixels,
                        match_weight=a.match_weight, continuation_weight=a.continuation_weight,
                        l2_credit=a.l2_credit, l3_credit=a.l3_credit,
                        load_token_unit=a.load_token_unit, health_interval=a.health_interval,
                        retries=a.retries, fallback_pages=a.fallback_pages,
                        redis_timeout=a.redis_timeout, request_timeout=a.request_timeout,
                        policy=a.policy, **extra)
