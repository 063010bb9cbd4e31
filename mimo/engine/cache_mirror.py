"""What a worker's caches hold, as page keys, for the cache-aware router to predict with.

`TreeMirror` listens to the radix tree (`RadixTree.listeners`) and keeps two sets of the
tiers' chained page keys (tiers/keys.py): pages whose full KV the tree holds, and pages whose
SWA KV is live. Those two sets decide exactly what a match would return: the key chain makes
a key name its whole prefix, so the run of leading keys present is the token-equal path, and
the L1 rule (full KV of [0, n) and live SWA on the window before n: `tiers.hit_plan.best_hit`)
gives the window-safe length `RadixTree.match` would cut it to. The router reads the sets
from Redis and applies the same rule (`mimo.router.predict`).

Changes are coalesced in `delta` (key -> present or not) until the publisher drains them
(cache_publisher.py); `snapshot` gives the whole state for a resync after Redis was away.
Listener calls come from the engine thread, drains from the event loop: one lock.

`TierMirror` does the same for the tiers below (partial credit): the keys of the
worker's host tier (L2), exact (`HostStore.on_change`), and what the worker learned of the
shared store (L3): names it stored or found there, and names it found missing
(`StorageTier.on_seen`). A store evicts by its own policy (Redis's LRU, a disk cap) without
telling anyone, so the L3 sets are learned: an entry gone is dropped once some worker's
lookup misses it. The Redis names of these sets are in `router/cache_events.py`.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

from ..kvcache.radix.node import Node
from ..kvcache.radix.tree import RadixTree
from ..kvcache.tiers.keys import FULL, SWA, KeyChain, node_keys
from ..router.cache_events import L2_FULL, L2_SWA

if TYPE_CHECKING:
    from ..kvcache.tiers.host_pool import HostPool
    from ..kvcache.tiers.storage_tier import StorageTier

_L3_KNOWN_CAP = 1 << 20             # L3 keys a worker remembers, to rewrite after an outage

log = logging.getLogger(__name__)


class _KeyDelta:
    """What both mirrors share: `delta` {(set kind, key): present} since the publisher's
    last `drain`, under `lock`, and `on_change` (wakes the publisher) called after each
    change."""

    def __init__(self) -> None:
        self.delta: dict[tuple[str, bytes], bool] = {}
        self.lock = threading.Lock()
        self.on_change: Callable[[], object] | None = None

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def drain(self) -> dict[tuple[str, bytes], bool]:
        with self.lock:
            d, self.delta = self.delta, {}
        return d


class TreeMirror(_KeyDelta):
    def __init__(self, tree: RadixTree, keys: KeyChain):
        super().__init__()
        self.tree, self.keys = tree, keys
        self.hybrid = tree.hybrid
        self.sets: dict[str, set[bytes]] = {FULL: set(), SWA: set()}
        self.resync = False         # set after a recovery: the publisher rewrites everything
        self._ns: dict[int, Hashable] = {}
        tree.listeners.append(self)

    # ---- TreeListener --------------------------------------------------------------------
    # Publishing must never fail a request: a listener error (a bug) is logged and the
    # mirror rebuilt from the whole tree, which the publisher then writes whole.
    def inserted(self, tokens: Sequence[int], namespace: Hashable) -> None:
        try:
            self._inserted(tokens, namespace)
        except Exception:  # noqa: BLE001
            self._recover()

    def evicted(self, node: Node, full_idx: list[int], swa_idx: list[int]) -> None:
        try:
            self._evicted(node, full_idx, swa_idx)
        except Exception:  # noqa: BLE001
            self._recover()

    def _recover(self) -> None:
        log.exception("cache publishing: rebuilding the mirror from the tree")
        try:
            self._rebuild()
        except Exception:  # noqa: BLE001 - give up publishing, never the request
            log.exception("cache publishing: rebuilding failed; publishing stops")
            with self.lock:
                self.sets, self.delta, self.resync = {FULL: set(), SWA: set()}, {}, True
            if self in self.tree.listeners:
                self.tree.listeners.remove(self)
        self._changed()

    def _rebuild(self) -> None:
        """Every node's keys chained afresh from its root (stored keys are not trusted)."""
        with self.lock:
            self.sets = {FULL: set(), SWA: set()}
            for ns, root in list(self.tree.paths.roots.items()):
                stack = [(c, self.keys.root(ns)) for c in root.children.values()]
                while stack:
                    node, prev = stack.pop()
                    node.keys = self.keys.extend(prev, node.tokens)
                    self.sets[FULL].update(node.keys)
                    if self.hybrid:
                        assert node.swa is not None
                        self.sets[SWA].update(k for k, x in zip(node.keys, node.swa) if x >= 0)
                    stack.extend((c, node.keys[-1]) for c in node.children.values())
            self.delta = {}
            self.resync = True

    def _inserted(self, tokens: Sequence[int], namespace: Hashable) -> None:
        changed = False
        with self.lock:
            for node, k in self.tree.path_nodes(tokens, namespace):
                keys = self._node_keys(node)
                for i in range(k):
                    changed |= self._set(FULL, keys[i], True)
                    if self.hybrid:
                        assert node.swa is not None
                        changed |= self._set(SWA, keys[i], node.swa[i] >= 0)
        if changed:
            self._changed()

    def _evicted(self, node: Node, full_idx: list[int], swa_idx: list[int]) -> None:
        keys = self._node_keys(node)
        with self.lock:
            for i in full_idx:
                self._set(FULL, keys[i], False)
                self._set(SWA, keys[i], False)
            for i in swa_idx:
                self._set(SWA, keys[i], False)
        self._changed()

    # ---- the publisher's side ------------------------------------------------------------
    def snapshot(self) -> dict[str, list[bytes]]:
        """The whole state; pending changes are part of it (and dropped from `delta`)."""
        with self.lock:
            self.delta = {}
            self.resync = False
            return {k: list(v) for k, v in self.sets.items()}

    # ---- helpers ---------------------------------------------------------------------------
    def _set(self, kind: str, key: bytes, present: bool) -> bool:
        s = self.sets[kind]
        if (key in s) == present:
            return False
        if present:
            s.add(key)
        else:
            s.discard(key)
        self.delta[(kind, key)] = present
        return True

    def _node_keys(self, node: Node) -> list[bytes]:
        return node_keys(self.keys, node, self.tree.namespace_of, self._ns)


class TierMirror(_KeyDelta):
    """The tiers' keys for the router: `host` (kind -> keys in L2, exact) and the L3 keys this
    worker learned, as `delta` {(set kind, key): present} for the publisher, set kinds being
    L2_FULL / L2_SWA and FULL / SWA for L3. Called from the engine thread (L2) and the
    storage I/O thread (L3); drained on the event loop: one lock."""
    def __init__(self, host: HostPool | None, storage: StorageTier | None) -> None:
        super().__init__()
        self.host: dict[str, set[bytes]] = {FULL: set(), SWA: set()}
        self.l3: OrderedDict[tuple[str, bytes], None] = OrderedDict()  # learned present
        if host is not None:
            for kind, store in host.stores.items():
                self.host[kind].update(store.index)
                store.on_change = (lambda key, present, k=kind: self._host(k, key, present))
        if storage is not None:
            storage.on_seen = self._seen

    def _host(self, kind: str, key: bytes, present: bool) -> None:
        with self.lock:
            (self.host[kind].add if present else self.host[kind].discard)(key)
            self.delta[(L2_FULL if kind == FULL else L2_SWA, key)] = present
        self._changed()

    def _seen(self, names: list[str], present: bool) -> None:
        with self.lock:
            for name in names:
                _, _, kind, hexkey = name.split(":")     # KeyChain.name: mimo:kv:KIND:HEX
                k = (kind, bytes.fromhex(hexkey))
                if present:
                    self.l3[k] = None
                    self.l3.move_to_end(k)
                    if len(self.l3) > _L3_KNOWN_CAP:
                        self.l3.popitem(last=False)
                else:
                    self.l3.pop(k, None)
                self.delta[k] = present
        self._changed()

    def snapshot(self) -> dict[str, list[bytes]]:
        """{set kind: keys}: the host sets whole, and the L3 keys this worker knows (added
        to the shared sets, never replacing them: other workers write there too)."""
        with self.lock:
            self.delta = {}
            out: dict[str, list[bytes]] = {L2_FULL: list(self.host[FULL]),
                                           L2_SWA: list(self.host[SWA]), FULL: [], SWA: []}
            for kind, key in self.l3:
                out[kind].append(key)
            return out
