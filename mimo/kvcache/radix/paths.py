"""The radix tree's shape: a root per namespace, walking a token path down it, splitting a
node, and the window arithmetic its rules are written in (which pages hold the window
before an end, which ends are window-safe, where a window rebuild starts).

Positions are token positions from the root; logical page g covers [g * P, (g + 1) * P).
"""
from __future__ import annotations

from array import array
from collections.abc import Hashable, Iterator, Mapping, Sequence

from .lru import LRU
from .node import Node
from .retention import window_first_page

Path = list[tuple[Node, int]]       # (node, pages of it on the path), root first


class Paths:
    def __init__(self, page_size: int, window: int, hybrid: bool, lru: LRU) -> None:
        self.P, self.W, self.hybrid = page_size, window, hybrid
        self.roots: dict[Hashable, Node] = {}
        self._lru = lru                     # a split enters the new node in the SWA order

    @staticmethod
    def tok(tokens: Sequence[int]) -> array[int]:
        return (tokens if isinstance(tokens, array) and tokens.typecode == "q"
                else array("q", tokens))

    def root(self, ns: Hashable, create: bool = False) -> Node | None:
        r = self.roots.get(ns)
        if r is None and create:
            r = self.roots[ns] = Node(None, array("q"), [], [] if self.hybrid else None, 0, 0)
        return r

    def namespace_of(self, root: Node) -> Hashable:
        """The namespace a root node stands for."""
        for ns, r in self.roots.items():
            if r is root:
                return ns
        raise KeyError("not a root of this tree")

    def nodes(self) -> Iterator[Node]:
        """Every node but the roots."""
        for root in self.roots.values():
            stack = list(root.children.values())
            while stack:
                n = stack.pop()
                yield n
                stack.extend(n.children.values())

    def walk(self, root: Node | None, toks: array[int], n_pages: int) -> tuple[Path, int]:
        """(path, tokens matched) along toks' first n_pages pages."""
        P, pos, node = self.P, 0, root
        path: Path = []
        while node is not None and pos // P < n_pages:
            child = node.children.get(tuple(toks[pos:pos + P]))
            if child is None:
                break
            k = min(len(child.full), n_pages - pos // P)
            if child.tokens[:k * P] != toks[pos:pos + k * P]:
                lo, hi = 1, k - 1       # first page equal (it is the key); find the last
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if child.tokens[:mid * P] == toks[pos:pos + mid * P]:
                        lo = mid
                    else:
                        hi = mid - 1
                k = lo
            path.append((child, k))
            pos += k * P
            node = child if k == len(child.full) else None
        return path, pos

    def split(self, node: Node, k: int) -> Node:
        """Split `node` after its first k pages; the new prefix node is returned and `node`
        keeps the suffix (so its end, and references to it, do not change)."""
        P, parent = self.P, node.parent
        assert parent is not None           # a root holds no pages to split
        pre = Node(parent, node.tokens[:k * P], node.full[:k],
                   None if node.swa is None else node.swa[:k], node.start, node.time)
        pre.lock_ref, pre.swa_time = node.lock_ref, node.swa_time
        pre.swa_lock = {i: c for i, c in node.swa_lock.items() if i < k}
        node.swa_lock = {i - k: c for i, c in node.swa_lock.items() if i >= k}
        if node.keys is not None:
            pre.keys, node.keys = node.keys[:k], node.keys[k:]
        node.tokens, node.full = node.tokens[k * P:], node.full[k:]
        if node.swa is not None:
            node.swa = node.swa[k:]
        node.start += k * P
        parent.children[tuple(pre.tokens[:P])] = pre
        pre.children[tuple(node.tokens[:P])] = node
        node.parent = pre
        self._lru.push_swa(pre)
        return pre

    # ---- window arithmetic ----------------------------------------------------------------
    def window(self, node: Node) -> Path:
        """(node, local page) pairs holding the window before node.end, walking up."""
        P = self.P
        out: Path = []
        first = window_first_page(node.end, self.W, P)
        n: Node | None = node
        while n is not None and n.parent is not None and n.end // P > first:
            s = n.start // P
            out.extend((n, i - s) for i in range(max(first, s), n.end // P))
            n = n.parent
        return out

    def safe_pages(self, live: Sequence[bool] | Mapping[int, bool], q: int, lo: int = 0) -> int:
        """Largest p in (lo, q] with SWA live (live[i]) on every page of the window before
        p*P, or lo if there is none. `live`: a list, or a dict covering at least the pages
        of the windows before (lo, q] (`path_live`)."""
        P, W = self.P, self.W
        while q > lo:
            for j in range(q - 1, window_first_page(q * P, W, P) - 1, -1):
                if not live[j]:
                    q = j           # any safe end must lie at or before the dead page
                    break
            else:
                return q
        return lo

    def path_live(self, node: Node, first: int) -> dict[int, bool]:
        """Whether each logical page in [first, node.end / P) on node's path has live SWA:
        what `safe_pages` reads to judge ends after page `first`'s window."""
        P, live, n = self.P, {}, node
        while n.parent is not None and n.end // P > first:
            s = n.start // P
            assert n.swa is not None        # a non-root node of a hybrid tree
            for i in range(max(first - s, 0), len(n.swa)):
                live[s + i] = n.swa[i] >= 0
            n = n.parent
        return live

    def rebuild_start(self, end: int, rebuild: int) -> int:
        """First page of a window rebuild ending at `end` (0: none; `Matcher.match` has the
        rule). Its SWA KV is exact from start + rebuild - (W - 1) on; the start is chosen so
        that this is no later than the first page of the window before `end`, so the whole
        window can be kept."""
        first = window_first_page(end, self.W, self.P) * self.P
        return max((first - (rebuild - (self.W - 1))) // self.P, 0)
