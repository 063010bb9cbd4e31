"""Builds the engine's face (face.py) from an LLMEngine: `engine_info` once, before the engine
thread starts; `engine_stats` on the engine thread after each iteration, the only reader of
the scheduler, pools and caches for monitoring."""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..cpu.features import cpu_info
from ..kvcache.tiers.keys import KeyChain, model_fingerprint
from ..kvcache.tiers.tiered_cache import TieredPrefixCache
from ..multimodal.adapter import adapter_for
from .face import EngineInfo, EngineStats, SpecTotals, StorageCounts, TierCounts, TierStats

if TYPE_CHECKING:
    from ..kvcache.tiers.storage_tier import StorageTier
    from .engine import LLMEngine


def kv_fingerprint(engine: LLMEngine) -> bytes:
    """The tiers' key fingerprint when the engine has tiers (the same keys as L3), else one
    from the same recipe over the built model's weights."""
    keys = getattr(engine.cache, "keys", None)
    if isinstance(keys, KeyChain):
        return keys.fingerprint
    from ..kvcache.tiers.build import weights_identity
    return model_fingerprint(engine.model_config.arch,
                             weights_identity(engine.model.state_dict().items()),
                             engine.pool.layout, engine.pool.page_size,
                             engine.config.runtime.dtype)


def engine_info(engine: LLMEngine) -> EngineInfo:
    mc, pool, rt = engine.model_config, engine.pool, engine.config.runtime
    adapter = adapter_for(mc)
    return EngineInfo(
        model=engine.config.model, arch=mc.arch, model_config=mc, vocab_size=mc.vocab_size,
        max_model_len=engine.max_model_len, stop_ids=frozenset(engine.eos_ids),
        tokenizer=engine.tokenizer, kv_tokens=pool.full.allocator.capacity * pool.page_size,
        page_size=pool.page_size, window=pool.window if pool.hybrid else 0,
        fingerprint=kv_fingerprint(engine), dtype=rt.dtype, device=rt.device,
        speculative=engine.config.spec.speculative,
        vision=adapter, encoder=adapter.encoder(engine.model) if adapter is not None else None)


def _frozen(d: Mapping[str, Any]) -> MappingProxyType[str, Any]:
    return MappingProxyType(dict(d))


def engine_stats(engine: LLMEngine, steps: int) -> EngineStats:
    """Engine thread only (or before it starts): reads the scheduler, pools and caches."""
    sched = engine.scheduler
    waiting = list(sched.waiting)
    tokens = sum(max(len(s.prompt_ids) - s.cached_tokens, 0) for s in waiting)
    tokens += sum(max(s.prefill_end - s.num_computed, 0) for s in sched.running)
    spec = getattr(engine.spec, "totals", None)     # a drafting decode step's (SpecStats)
    cache = engine.cache
    info = cpu_info()
    return EngineStats(
        steps=steps, waiting=len(waiting), running=len(sched.running), uncached_tokens=tokens,
        pools=_frozen({k: _frozen(v) for k, v in engine.pool.stats().items()}),
        preemptions=sched.num_preemptions, failed_steps=engine.failed_steps,
        spec=SpecTotals(spec.steps, spec.emitted, tuple(spec.drafted), tuple(spec.accepted))
        if spec is not None else None,
        cache=_frozen(cache.counters()) if cache is not None else None,
        tiers=tier_stats(cache) if isinstance(cache, TieredPrefixCache) else None,
        cpu=info.model, cpu_flags=info.flags, kernels=engine.weights.kernels,
        weights=engine.weights.format, dtype=engine.config.runtime.dtype,
        kv_imported=engine.transfers.imported, kv_import_recomputed=engine.transfers.recomputed)


def tier_stats(c: TieredPrefixCache) -> TierStats:
    """A TieredPrefixCache's totals (its storage counters are written by the storage thread:
    plain ints, copied as they stand)."""
    tiers = [("l2", c.l2)] if c.host is not None else []
    if c.storage is not None:
        tiers.append(("l3", c.l3))
    counts = tuple(TierCounts(name, t.hit_tokens, t.miss_tokens, t.bytes_read, t.bytes_written,
                              _frozen(t.pages_read), _frozen(t.pages_written))
                   for name, t in tiers)
    host = (_frozen({k: _frozen(st) for k, st in c.host.stats().items()})
            if c.host is not None else None)
    return TierStats(c.l1_hit_tokens, c.load_errors, counts, host,
                     _storage(c.storage) if c.storage is not None else None)


def _storage(st: StorageTier) -> StorageCounts:
    from ..kvcache.tiers.storage_tier import LATENCY_BUCKETS
    w = st.stats
    errors = {cause: n + (w.fetch_timeouts if cause == "timeout" else 0)
              for cause, n in dict(st.storage.stats.errors).items()}
    acc, buckets = 0, []
    for ub, n in zip((*LATENCY_BUCKETS, float("inf")), list(w.latency_counts)):
        acc += n
        buckets.append((ub, acc))
    return StorageCounts(_frozen(errors), w.dropped, w.failed, tuple(buckets), w.latency_sum)
