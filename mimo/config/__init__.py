"""Frozen configuration, one dataclass per layer of the system.

Each component receives only its slice (the KV cache never sees the scheduler's config, the
scheduler never sees the model's weights). `from_dict` rejects unknown keys so a misspelt
option fails loudly instead of being silently ignored.

One module per layer: base (errors, sizes), model, runtime (cache, scheduler, device),
engine (speculation, tiers, the whole engine), server.
"""
from .base import ConfigError, _from_dict, parse_size
from .engine import EngineConfig, SpecConfig, TierConfig
from .model import ModelConfig, VisionConfig
from .runtime import (
    ATTENTION_BACKENDS,
    PREFILL_MATMULS,
    QUANTIZE,
    RETENTION_POLICIES,
    CacheConfig,
    RuntimeConfig,
    SchedulerConfig,
)
from .server import ServerConfig, check_responses_store

__all__ = ["ATTENTION_BACKENDS", "PREFILL_MATMULS", "QUANTIZE", "RETENTION_POLICIES",
           "CacheConfig", "ConfigError", "EngineConfig", "ModelConfig", "RuntimeConfig",
           "SchedulerConfig", "ServerConfig", "SpecConfig", "TierConfig", "VisionConfig",
           "_from_dict", "check_responses_store", "parse_size"]
