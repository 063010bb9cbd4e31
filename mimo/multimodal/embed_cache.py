"""Embedding cache: vision-encoder outputs by media content, LRU bounded by bytes.

The key is the sha256 of the media bytes plus the processor settings' fingerprint: the
same image preprocessed differently (another max_pixels) gives other embeddings, while the
same bytes from two URLs give the same ones. A request's cache salt joins the key
(`salted_key`). Thread-safe: encoders may run off the loop.
"""
from __future__ import annotations

import collections
import hashlib
import threading
from dataclasses import dataclass

import torch


def content_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_key(digest: str, settings_fingerprint: str, extra: str = "") -> str:
    """Cache key for the bytes whose `content_digest` is `digest`, under the given processor
    settings. `extra` carries anything else that changes the pixels (a video's fps, frame
    count or stream)."""
    return f"{digest}:{settings_fingerprint}" + (f":{extra}" if extra else "")


def salted_key(key: str, salt: str | None) -> str:
    """An item's cache key for a request under a `cache_salt`: embeddings one salt made are
    never served to another (a hit's speed would tell that someone sent the same picture)."""
    if salt is None:
        return key
    return f"{key}:salt:{hashlib.sha256(salt.encode()).hexdigest()}"


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    rejected: int = 0     # entries larger than the whole cache, never stored

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class EmbedCache:
    """LRU of tensors, bounded by the sum of their `nbytes` (`capacity_bytes`)."""

    def __init__(self, capacity_bytes: int):
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.capacity_bytes = capacity_bytes
        self.nbytes = 0
        self.stats = CacheStats()
        self._entries: collections.OrderedDict[str, torch.Tensor] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries   # no recency update, no counters: a peek

    def get(self, key: str) -> torch.Tensor | None:
        with self._lock:
            t = self._entries.get(key)
            if t is None:
                self.stats.misses += 1
                return None
            self._entries.move_to_end(key)
            self.stats.hits += 1
            return t

    def put(self, key: str, value: torch.Tensor) -> bool:
        """Store `value`; evicts least-recently-used entries to make room. Returns False
        (and stores nothing) when the value alone is over the capacity."""
        size = value.nbytes
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= old.nbytes
            if size > self.capacity_bytes:
                self.stats.rejected += 1
                return False
            while self.nbytes + size > self.capacity_bytes:
                _, evicted = self._entries.popitem(last=False)
                self.nbytes -= evicted.nbytes
                self.stats.evictions += 1
            self._entries[key] = value
            self.nbytes += size
            return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.nbytes = 0
