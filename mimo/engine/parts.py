"""EngineParts: the swappable parts of the engine loop, handed to `LLMEngine` as one object.

Each engine step is: prefix match at admission (the `PrefixCache`), prefill chunks sized by
the `PrefillPlanner` and decode tokens scheduled together, then one forward, run and turned
into tokens by the `DecodeStep`. Swapping one part touches neither the scheduler nor the
other parts. A part left None is built from the engine's config:

    prefix_cache   pools -> PrefixCache   RadixPrefixCache (config.cache: retention, window
                                          rebuild) when config.cache.prefix_cache, else none
    prefill        PrefillPlanner         ChunkedPrefill
    decode         DecodeStep             PlainDecode, or SpecDecoder when config.spec is on

The prefix cache is given as a factory because it is built on the engine's own pools (which
exist only once the engine has sized them); a `RadixPrefixCache` subclass is one as it is.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import CacheConfig, EngineConfig
from .decode_step import DecodeStep, PlainDecode
from .prefill_planner import ChunkedPrefill, PrefillPlanner

if TYPE_CHECKING:
    from ..kvcache.pool.dual_pool import DualPool
    from ..kvcache.radix.prefix_cache import PrefixCache

PrefixCacheFactory = Callable[["DualPool"], "PrefixCache | None"]


@dataclass(frozen=True)
class EngineParts:
    prefix_cache: PrefixCacheFactory | None = None   # None -> RadixPrefixCache per config
    prefill: PrefillPlanner | None = None            # None -> ChunkedPrefill
    decode: DecodeStep | None = None                 # None -> PlainDecode / SpecDecoder

    def build_prefix_cache(self, cache: CacheConfig, pool: DualPool) -> PrefixCache | None:
        """The engine's prefix cache on `pool` (None: no caching). A given factory decides
        alone (it may return None); the default follows `cache.prefix_cache`."""
        if self.prefix_cache is not None:
            return self.prefix_cache(pool)
        if not cache.prefix_cache:
            return None
        from ..kvcache.radix.cache import RadixPrefixCache
        return RadixPrefixCache(pool, cache.retention, rebuild=cache.window_rebuild)

    def build_prefill(self) -> PrefillPlanner:
        return self.prefill or ChunkedPrefill()

    def build_decode(self, config: EngineConfig, model_config, model, runner) -> DecodeStep:
        """The given decode step, or the config's: speculative decoding (`config.spec`)
        drafts with the model and runner, else plain sampling."""
        if self.decode is not None:
            return self.decode
        if config.spec.enabled:
            from ..spec import make_drafter
            from ..spec.decoder import SpecDecoder
            return SpecDecoder(make_drafter(config.spec, model_config, model, runner),
                               config.spec.num_draft_tokens)
        return PlainDecode()
