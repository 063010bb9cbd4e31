"""Page keys shared by every tier and every process: chained hashes of page-aligned tokens.

A page's key is H(previous page's key, the page's tokens); the chain starts at a root of
H(model fingerprint, namespace). So any process serving the same model computes the same
keys for the same prefix, a page's key names its whole prefix (equal keys mean equal KV),
and KV of another model, dtype, page size or layout (the fingerprint) can never be found.
The namespace is the request's key space in the prefix cache (media hashes of a multimodal
prompt; None for text), so an image prompt never hits another image's KV.

Storage names carry the kind of KV: 'f' (the full-attention layers) or 's' (the SWA
layers, MTP layers included), which tiers store separately: full KV for every cached page,
SWA only for the windows the retention policy keeps.
"""
from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

from ..pool.layout import KVLayout

if TYPE_CHECKING:
    from ..radix.node import Node

DIGEST = 16     # bytes per key: collisions are out of reach at 2^64 pages

FULL, SWA = "f", "s"


def _h(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=DIGEST)
    for p in parts:
        h.update(p)
    return h.digest()


def model_fingerprint(arch: str, weights_id: str, layout: KVLayout, page_size: int,
                      dtype: str) -> bytes:
    """Identity of the KV a model writes: its architecture, its weights, the KV dtype, the
    page size and each pool's layer shapes and window."""
    desc = repr((arch, weights_id, dtype, page_size, layout.hybrid, layout.window,
                 [(lay.kv_heads, lay.k_dim, lay.v_dim) for lay in layout.full],
                 [(lay.kv_heads, lay.k_dim, lay.v_dim) for lay in layout.swa]))
    return _h(b"mimo-kv-1", desc.encode())


class KeyChain:
    def __init__(self, fingerprint: bytes, page_size: int):
        self.fingerprint = fingerprint
        self.P = page_size

    def root(self, namespace: Hashable) -> bytes:
        return _h(self.fingerprint, b"ns", repr(namespace).encode())

    def extend(self, prev: bytes, tokens: Sequence[int]) -> list[bytes]:
        """Keys of the whole pages of `tokens`, continuing the chain after `prev`."""
        P = self.P
        raw = (tokens if isinstance(tokens, array) and tokens.typecode == "q"
               else array("q", tokens)).tobytes()
        out, step = [], 8 * P
        for i in range(len(raw) // step):
            prev = _h(prev, raw[i * step:(i + 1) * step])
            out.append(prev)
        return out

    def page_keys(self, tokens: Sequence[int], namespace: Hashable = None) -> list[bytes]:
        return self.extend(self.root(namespace), tokens)

    @staticmethod
    def name(kind: str, key: bytes) -> str:
        """The storage name of a page's KV of one kind."""
        return f"mimo:kv:{kind}:{key.hex()}"


def node_keys(chain: KeyChain, node: Node, namespace_of: Callable[[Node], Hashable],
              roots: dict[int, Hashable]) -> list[bytes]:
    """A radix node's page keys, kept in its `keys` slot and chained from its nearest
    ancestor that has them (a child of the root chains from the namespace's root key).
    Every part that reads `Node.keys` (the tiers, the router's cache publishing) goes
    through here with the model's one KeyChain, so the slot has one meaning. `roots` memoizes
    the namespace under each root child (`namespace_of` walks the tree)."""
    path, n = [], node
    while n.parent is not None and n.keys is None:
        path.append(n)
        n = n.parent
    if n.parent is None:
        if id(n) not in roots:
            roots[id(n)] = namespace_of(n)
        prev = chain.root(roots[id(n)])
    else:
        assert n.keys is not None
        prev = n.keys[-1]
    for m in reversed(path):
        m.keys = chain.extend(prev, m.tokens)
        prev = m.keys[-1]
    assert node.keys is not None
    return node.keys
