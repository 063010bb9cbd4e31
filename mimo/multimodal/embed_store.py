"""The embedding cache an encoder process uses: its own LRU (`EmbedCache`) in front of the
machine's shared-memory cache (`SharedEmbedCache`) when one is configured, behind the same
get/put/stats face as EmbedCache. A local miss that the shared segment holds is a hit (and
is copied into the local LRU); every encoding is stored in both.

`tower_fingerprint` names the encoder whose outputs a cache holds: the shared segment's
keys carry it, and a remote encoder refuses requests made for another one.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from .embed_cache import CacheStats, EmbedCache
from .shm_cache import SharedEmbedCache


@dataclass(frozen=True)
class ShmSpec:
    """A shared-memory embedding cache: its name (files /dev/shm/NAME.*) and size."""
    name: str
    capacity_bytes: int


def tower_fingerprint(encoder, dtype: str) -> str:
    """The identity of a vision encoder's outputs: its parameters' names, shapes and dtypes,
    a sample of their values, and the dtype it runs in. `encoder` is the tower module, or a
    bound method of a model whose `visual` is the tower (the in-process encoder); both give
    the same digest for the same checkpoint."""
    module = encoder if isinstance(encoder, torch.nn.Module) else getattr(encoder, "__self__", None)
    module = getattr(module, "visual", module)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"cannot fingerprint the encoder {encoder!r}: no tower module")
    h = hashlib.blake2b(f"mimo-tower-1|{dtype}|".encode(), digest_size=16)
    for name, t in sorted(module.state_dict().items(), key=lambda kv: kv[0]):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        h.update(t.detach().reshape(-1)[:256].to(torch.float32).cpu().numpy().tobytes())
    return h.hexdigest()


class LayeredEmbedCache:
    def __init__(self, local: EmbedCache, shared: SharedEmbedCache):
        self.local, self.shared = local, shared
        self.stats = CacheStats()
        self.shared_hits = 0            # hits the local LRU missed and the segment had

    def __len__(self) -> int:
        return len(self.local)

    def __contains__(self, key: str) -> bool:
        return key in self.local or key in self.shared

    def get(self, key: str) -> torch.Tensor | None:
        t = self.local.get(key)
        if t is None:
            t = self.shared.get(key)
            if t is not None:
                self.shared_hits += 1
                self.local.put(key, t)
        if t is None:
            self.stats.misses += 1
        else:
            self.stats.hits += 1
        return t

    def put(self, key: str, value: torch.Tensor) -> bool:
        kept = self.local.put(key, value)
        return self.shared.put(key, value) or kept

    def clear(self) -> None:
        self.local.clear()

    def close(self) -> None:
        self.shared.close()


def make_embed_cache(capacity_bytes: int, shm: ShmSpec | None, fingerprint: str
                     ) -> EmbedCache | LayeredEmbedCache:
    local = EmbedCache(capacity_bytes)
    if shm is None:
        return local
    return LayeredEmbedCache(local, SharedEmbedCache(shm.name, shm.capacity_bytes, fingerprint))


def close_cache(cache) -> None:
    """Detach a cache from its shared segment, if it has one."""
    close = getattr(cache, "close", None)
    if close is not None:
        close()
