"""EmbedCache: byte-bounded LRU with counters, checked against a brute-force model."""
from __future__ import annotations

import random

import torch

from mimo.multimodal.embed_cache import EmbedCache, content_digest, digest_key
from mimo.multimodal.preprocess import ProcessorSettings


def test_key_depends_on_bytes_and_settings():
    a, b = ProcessorSettings(), ProcessorSettings(max_pixels=512 * 28 * 28)
    def media_key(data: bytes, fp: str, extra: str = "") -> str:
        return digest_key(content_digest(data), fp, extra)
    k = media_key(b"img", a.fingerprint())
    assert k == media_key(b"img", ProcessorSettings().fingerprint())
    assert k != media_key(b"img", b.fingerprint()) != media_key(b"img2", a.fingerprint())
    assert k != media_key(b"img", a.fingerprint(), extra="fps=1")


def test_lru_by_bytes():
    c = EmbedCache(capacity_bytes=3 * 400)
    t = lambda: torch.zeros(100)   # 400 bytes
    for k in "abc":
        assert c.put(k, t())
    assert c.get("a") is not None          # a is now most recent
    c.put("d", t())                        # evicts b, the least recently used
    assert "b" not in c and {"a", "c", "d"} <= {k for k in "abcd" if k in c}
    assert c.nbytes == 1200 and c.stats.evictions == 1
    assert c.get("b") is None and c.stats.hits == 1 and c.stats.misses == 1
    assert not c.put("huge", torch.zeros(1000)) and c.stats.rejected == 1 and c.nbytes == 1200
    c.put("a", torch.zeros(10))            # replacing an entry frees its old bytes
    assert c.nbytes == 840


def test_against_brute_force_model():
    rng = random.Random(0)
    cap = 5000
    c = EmbedCache(cap)
    model: list[tuple[str, int]] = []      # LRU order, oldest first
    hits = misses = 0
    for _ in range(3000):
        key = f"k{rng.randrange(40)}"
        if rng.random() < 0.5:
            got = c.get(key)
            idx = next((i for i, (k, _) in enumerate(model) if k == key), None)
            assert (got is None) == (idx is None)
            if idx is None:
                misses += 1
            else:
                hits += 1
                model.append(model.pop(idx))
        else:
            n = rng.randrange(1, 400)
            c.put(key, torch.zeros(n, dtype=torch.uint8) if rng.random() < 0.5
                  else torch.zeros(n // 4 + 1, dtype=torch.float32))
            size = c._entries[key].nbytes if key in c else None
            model = [(k, s) for k, s in model if k != key]
            if size is not None:
                while sum(s for _, s in model) + size > cap:
                    model.pop(0)
                model.append((key, size))
        assert [k for k, _ in model] == list(c._entries)
        assert c.nbytes == sum(s for _, s in model) <= cap
    assert (c.stats.hits, c.stats.misses) == (hits, misses)
