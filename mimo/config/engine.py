"""Speculative decoding, the KV tiers, and the engine's whole configuration."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .base import ConfigError, _from_dict, parse_size
from .runtime import CacheConfig, RuntimeConfig, SchedulerConfig


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding. `speculative`: None (off), 'ngram' (prompt lookup: any model) or
    'mtp' (the model's multi-token-prediction layers; refused for a model without them).
    Each decoding request gets up to `num_draft_tokens` drafts per step, verified by the
    target in the same forward (mtp: clamped to the model's MTP layer count, one draft per
    layer, rather than refused, so the default works for any MTP model). The n-gram drafter
    matches the last n tokens, n from `ngram_max` down to `ngram_min`, against the request's
    earlier tokens."""
    speculative: str | None = None
    num_draft_tokens: int = 4
    ngram_max: int = 4
    ngram_min: int = 1

    def __post_init__(self):
        if self.speculative not in (None, "ngram", "mtp"):
            raise ConfigError(f"speculative must be ngram or mtp, not {self.speculative!r}")
        if isinstance(self.num_draft_tokens, bool) or not isinstance(self.num_draft_tokens, int) \
                or not 1 <= self.num_draft_tokens <= 64:
            raise ConfigError("num_draft_tokens must be an integer in [1, 64]")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError("need 1 <= ngram_min <= ngram_max")

    @property
    def enabled(self) -> bool:
        return self.speculative is not None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpecConfig:
        return _from_dict(cls, data)


@dataclass(frozen=True)
class TierConfig:
    """KV tiers below the device pools (L1): host memory (L2) and shared storage (L3).

    `host_kv_cache_memory`: bytes of host memory for pages L1 evicts (0: no L2). With
    storage and no host budget, loads from storage go straight into L1.
    `kv_storage`: 'file:DIR', 'redis://HOST:PORT[/DB]' or 'redis-cluster://HOST:PORT[,...]'
    (None: no L3). `kv_disk_cap`: byte cap of a file: store (None: unbounded).
    `kv_storage_timeout`: deadline in seconds of one storage lookup or write batch; past it
    the lookup is a miss (a Redis client's connect and socket timeouts are this deadline
    too). `kv_keepalive`: seconds between refreshes of a hot prefix's L3 keys
    (0: never), so an L3 with its own eviction keeps what L1/L2 keep hitting.
    `kv_storage_write`: 'through' (prefixes written as their prefill runs and when their
    request ends) or 'off' (read only). `kv_write_queue`: write batches waiting for
    storage; beyond it a write is dropped and counted."""
    host_kv_cache_memory: int = 0
    kv_storage: str | None = None
    kv_disk_cap: int | None = None
    kv_storage_timeout: float = 2.0
    kv_keepalive: float = 30.0
    kv_storage_write: str = "through"
    kv_write_queue: int = 64

    def __post_init__(self):
        if self.host_kv_cache_memory < 0:
            raise ConfigError("host_kv_cache_memory must be >= 0")
        if self.kv_disk_cap is not None and self.kv_disk_cap <= 0:
            raise ConfigError("kv_disk_cap must be positive")
        if not self.kv_storage_timeout > 0:
            raise ConfigError("kv_storage_timeout must be > 0 seconds")
        if self.kv_keepalive < 0:
            raise ConfigError("kv_keepalive must be >= 0 seconds (0: off)")
        if self.kv_storage_write not in ("through", "off"):
            raise ConfigError("kv_storage_write must be 'through' or 'off'")
        if self.kv_write_queue < 1:
            raise ConfigError("kv_write_queue must be >= 1")
        if self.kv_storage is not None and not self.kv_storage.startswith(
                ("file:", "redis://", "rediss://", "redis-cluster://")):
            raise ConfigError(f"kv_storage {self.kv_storage!r}: use file:DIR, "
                              "redis://HOST:PORT or redis-cluster://HOST:PORT[,HOST:PORT...]")

    @property
    def enabled(self) -> bool:
        return self.host_kv_cache_memory > 0 or self.kv_storage is not None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TierConfig:
        data = dict(data)
        for k in ("host_kv_cache_memory", "kv_disk_cap"):
            if data.get(k) is not None:
                data[k] = parse_size(data[k])
        return _from_dict(cls, data)


@dataclass(frozen=True)
class EngineConfig:
    model: str = "gemma-3-270m"
    max_model_len: int | None = None
    seed: int = 0
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    spec: SpecConfig = field(default_factory=SpecConfig)
    tiers: TierConfig = field(default_factory=TierConfig)
