"""The router's prediction against the real tree: a TreeMirror follows a RadixTree through
the random request / evict sequences of the radix property tests (real retention policies,
window rebuild on and off, full-kv), and after every step, for prompts sharing prefixes with
what is cached, the length predicted from the mirror's two key sets alone (what the router
reads from Redis) equals what the tree's own `peek` says a match would reuse."""
from __future__ import annotations

from hypothesis import settings
from hypothesis.stateful import invariant
from kvcache.test_radix_property import (
    BASES,
    SETTINGS,
    FullKVMachine,
    PolicyMachine,
    PromptsMachine,
    TreeMachine,
)

from mimo.engine.cache_mirror import TreeMirror
from mimo.kvcache.tiers.keys import FULL, SWA, KeyChain
from mimo.router.policy import predicted_tokens


def _probes():
    out = []
    for b in BASES:
        for cut in range(1, len(b) + 1, 3):
            out.append(b[:cut])
            out.append(b[:cut] + [1, 2])
    return out


PROBES = _probes()


class Mirrored:
    def mirror(self):
        m = getattr(self, "_mirror", None)
        if m is None or m.tree is not self.tree:
            m = self._mirror = TreeMirror(self.tree, KeyChain(b"fp", self.P))
        return m

    @invariant()
    def prediction_matches_tree(self):
        if not hasattr(self, "tree"):
            return
        m = self.mirror()
        P, W = self.P, self.W
        for ns in (None, "img"):
            for toks in PROBES:
                q = toks[:-1]
                n = len(q) // P
                keys = m.keys.page_keys(q[:n * P], ns)
                full_ok = [k in m.sets[FULL] for k in keys]
                swa_ok = [k in m.sets[SWA] for k in keys] if self.hybrid else None
                got = predicted_tokens(full_ok, swa_ok, W, P, self.tree.rebuild)
                assert got == self.tree.peek(q, ns), (toks, ns, got, self.tree.peek(q, ns))

    @invariant()
    def delta_replays_to_sets(self):
        """What the publisher sends (drained deltas, applied in order) rebuilds the sets."""
        if not hasattr(self, "tree"):
            return
        m = self.mirror()
        pub = getattr(self, "_published", None)
        if pub is None:
            pub = self._published = {k: set(v) for k, v in m.snapshot().items()}
        for (kind, key), present in m.drain().items():
            (pub[kind].add if present else pub[kind].discard)(key)
        assert pub == m.sets


class MirroredHybrid(Mirrored, TreeMachine):
    pass


class MirroredPolicy(Mirrored, PolicyMachine):
    pass


class MirroredPrompts(Mirrored, PromptsMachine):
    pass


class MirroredFullKV(Mirrored, FullKVMachine):
    pass


TestHybrid = MirroredHybrid.TestCase
TestHybrid.settings = settings(SETTINGS, max_examples=80)
TestPolicy = MirroredPolicy.TestCase
TestPolicy.settings = settings(SETTINGS, max_examples=80)
TestPrompts = MirroredPrompts.TestCase
TestPrompts.settings = settings(SETTINGS, max_examples=60)
TestFullKV = MirroredFullKV.TestCase
TestFullKV.settings = settings(SETTINGS, max_examples=40)


def test_a_listener_error_never_reaches_the_tree_and_the_mirror_recovers():
    """A broken node key (standing for a bug in the listener) must not fail the insert: the
    mirror rebuilds itself from the whole tree and asks the publisher for a full rewrite."""
    from mimo.kvcache.pool.allocator import PageAllocator
    from mimo.kvcache.radix.retention import RetentionPolicy
    from mimo.kvcache.radix.tree import RadixTree
    fa, sa = PageAllocator(32, "full"), PageAllocator(32, "swa")
    tree = RadixTree(4, 3, fa, sa, RetentionPolicy(keep_all=True))
    m = TreeMirror(tree, KeyChain(b"fp", 4))
    a = list(range(1, 17))
    tree.insert(a, fa.alloc(4), sa.alloc(4))
    (node, _), = tree.path_nodes(a)
    node.keys = []                      # corrupt: the next insert below it cannot chain
    b = a + [9, 9, 9, 9]
    tree.insert(b, list(tree.path_pages(a)[0]) + fa.alloc(1),
                list(tree.path_pages(a)[1]) + sa.alloc(1))
    assert m.resync
    chain = KeyChain(b"fp", 4)
    assert m.sets[FULL] == set(chain.page_keys(b)) and m.sets[SWA] == set(chain.page_keys(b))
    assert tree.peek(b + [1]) == 20
