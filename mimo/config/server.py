"""The HTTP server's options."""
from __future__ import annotations

from dataclasses import dataclass

from .base import ConfigError
from .peers import check_peers


def check_responses_store(url: str | None) -> None:
    """ConfigError unless `url` names a responses store: memory:// (None: the same) or
    redis://HOST[:PORT][/DB] (rediss:// with TLS)."""
    if url is None or url == "memory://":
        return
    from urllib.parse import urlparse
    u = urlparse(url)
    if u.scheme not in ("redis", "rediss") or not u.hostname:
        raise ConfigError(f"responses store must be memory:// or redis://HOST:PORT[/DB] "
                          f"(or rediss://), got {url!r}")
    try:
        _ = u.port
    except ValueError:
        raise ConfigError(f"responses store URL has a bad port: {url!r}") from None


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP front: where it listens, who may call it, how much it accepts."""
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None     # default: the --model value
    max_body_bytes: int = 8 * 2**20
    max_in_flight: int = 256                 # requests inside the pipeline at once
    max_queued: int = 1024                   # beyond max_in_flight; more get HTTP 503
    # seconds an idle engine waits for requests still being tokenized (AsyncEngine)
    gather_wait: float = 0.02
    embed_cache_bytes: int = 512 * 2**20     # vision-encoder outputs kept by media content
    # 1: the vision encoder runs in the server process; N > 1: N encoder processes, each
    # with its own embedding cache of embed_cache_bytes, media routed by the hash ring.
    encoder_workers: int = 1
    # Remote encoders (`--role encoder` workers) instead of local ones, routed by the hash
    # ring on the media hash or round-robin; and the machine's shared-memory embedding cache
    # behind every local cache (0 MiB: off), named /dev/shm/<encoder_shm_name>.*
    encoder_urls: tuple[str, ...] = ()
    encoder_routing: str = "hash"
    encoder_shm_cache_mb: int = 0
    encoder_shm_name: str = "mimo-embeds"
    # ---- API
    body_read_timeout: float = 30.0          # seconds to receive a whole body (else 408)
    metrics_public: bool = False             # /metrics without the API key
    default_max_tokens: int | None = None    # max_tokens when a request sends none (None: the rest)
    # ---- router: publish cache state and load for `python -m mimo.router`
    router_redis: str | None = None          # redis://... or redis-cluster://...; None: off
    advertise_url: str | None = None         # this server as routers reach it (default: host:port)
    router_heartbeat: float = 0.5            # seconds between heartbeats (TTL: 6 of them)
    # ---- /v1/responses: where finished responses are kept for previous_response_id
    responses_store: str | None = None       # None / memory://: this process; redis://...: shared
    responses_ttl: float = 86400.0           # seconds a stored response lives
    web_ui: bool = True                      # the chat page at / (api/web_ui.py)
    # ---- disaggregated serving (mimo/disagg): both, prefill or decode
    role: str = "both"
    kv_transfer_timeout: float = 60.0        # decode role: longest silence of a KV stream (s)
    # decode role: the prefill workers it may take KV from (normalized; empty: loopback only)
    prefill_peers: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.body_read_timeout > 0:
            raise ConfigError("body_read_timeout must be > 0")
        if self.default_max_tokens is not None and self.default_max_tokens < 1:
            raise ConfigError("default_max_tokens must be >= 1")
        if not 0 <= self.port < 65536:
            raise ConfigError("port must be in [0, 65535]")
        if self.max_body_bytes < 1024:
            raise ConfigError("max_body_bytes must be >= 1024")
        if self.max_in_flight < 1 or self.max_queued < 0:
            raise ConfigError("max_in_flight must be >= 1 and max_queued >= 0")
        if not 0 <= self.gather_wait < float("inf"):
            raise ConfigError(f"gather_wait must be a finite number of seconds >= 0, "
                              f"not {self.gather_wait}")
        if self.embed_cache_bytes < 0:
            raise ConfigError("embed_cache_bytes must be >= 0")
        if self.encoder_workers < 1:
            raise ConfigError(f"encoder_workers must be >= 1, not {self.encoder_workers}")
        if not self.router_heartbeat > 0:
            raise ConfigError("router_heartbeat must be > 0")
        if not self.responses_ttl >= 1:
            raise ConfigError("responses_ttl must be >= 1 second")
        check_responses_store(self.responses_store)
        if self.role not in ("both", "prefill", "decode", "encoder"):
            raise ConfigError(f"role must be both, prefill, decode or encoder, not {self.role!r}")
        self._check_encoders()
        if not self.kv_transfer_timeout > 0:
            raise ConfigError("kv_transfer_timeout must be > 0")
        if self.prefill_peers and self.role != "decode":
            raise ConfigError("--prefill-peer is a decode worker's allow-list: it needs "
                              "--role decode")
        object.__setattr__(self, "prefill_peers", check_peers(tuple(self.prefill_peers)))

    def _check_encoders(self) -> None:
        import re
        object.__setattr__(self, "encoder_urls", tuple(self.encoder_urls))
        for u in self.encoder_urls:
            if not re.match(r"^https?://[^/\s]+/?$", u):
                raise ConfigError(f"encoder worker URL must be http(s)://HOST:PORT, not {u!r}")
        if self.encoder_urls and self.encoder_workers != 1:
            raise ConfigError("encoder_workers (local encoder processes) and encoder worker "
                              "URLs (remote ones) exclude each other")
        if self.encoder_routing not in ("hash", "round-robin"):
            raise ConfigError(f"encoder_routing must be hash or round-robin, not "
                              f"{self.encoder_routing!r}")
        if self.encoder_shm_cache_mb < 0:
            raise ConfigError("encoder_shm_cache_mb must be >= 0")
        if not re.match(r"^[A-Za-z0-9_.-]{1,100}$", self.encoder_shm_name):
            raise ConfigError(f"encoder_shm_name must be 1-100 of [A-Za-z0-9_.-], not "
                              f"{self.encoder_shm_name!r}")
