"""Assemble the tiers below an engine's L1 radix cache from its `TierConfig`."""
from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch

from ...config import ConfigError, TierConfig
from ..radix.cache import RadixPrefixCache
from .host_pool import HostPool
from .keys import FULL, SWA, KeyChain
from .page_io import PageIO
from .tiered_cache import TieredPrefixCache


def weights_identity(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """A digest of a model's weights that any process loading the same checkpoint computes
    alike: every tensor's name, shape and dtype, and a sample of its first values."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in sorted(named_tensors, key=lambda nt: nt[0]):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        flat = t.detach().reshape(-1)[:256]
        if flat.is_floating_point():
            h.update(flat.to(torch.float32).cpu().numpy().tobytes())
        else:
            h.update(flat.to(torch.int64).cpu().numpy().tobytes())
    return h.hexdigest()


def build_tiers(cfg: TierConfig, l1: RadixPrefixCache, fingerprint: bytes) -> TieredPrefixCache:
    pool = l1.pool
    io = {FULL: PageIO(pool.full)}
    if pool.hybrid:
        io[SWA] = PageIO(pool.swa)
    keys = KeyChain(fingerprint, pool.page_size)
    host = None
    if cfg.host_kv_cache_memory > 0:
        weights = {k: (pool.full if k == FULL else pool.swa).allocator.capacity * v.row_bytes
                   for k, v in io.items()}
        host = HostPool(cfg.host_kv_cache_memory, {k: v.row_bytes for k, v in io.items()},
                        {k: v.row_elems for k, v in io.items()}, weights, io[FULL].dtype,
                        pin=io[FULL].device.type == "cuda")
        if not host.stores[FULL].alloc.capacity:
            raise ConfigError(f"host_kv_cache_memory={cfg.host_kv_cache_memory} bytes holds no "
                              f"page ({io[FULL].row_bytes} bytes per full page)")
    storage = None
    if cfg.kv_storage is not None:
        from .storage import open_storage
        from .storage_tier import StorageTier
        backend = open_storage(cfg.kv_storage, disk_cap=cfg.kv_disk_cap,
                               timeout=cfg.kv_storage_timeout)
        storage = StorageTier(backend, keys, io, pool.window, cfg.kv_storage_timeout,
                              cfg.kv_write_queue)
    return TieredPrefixCache(l1, keys, io, host, storage, cfg)
