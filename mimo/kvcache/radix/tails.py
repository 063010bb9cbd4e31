"""Partial pages: the first rows of a cached page reused by copying them.

The tree shares whole pages only, and a request's last page is mostly partial, so a prompt
seen before (a retried call, a regenerated answer, a preempted request resumed) recomputed
up to a page of tokens the cache had. Two sources hold such rows beyond a match's end node:
- the first page of one of its children whose tokens agree with the prompt's for a while;
- its *tail*: the partial last page a finished request left at the node's end (here, one per
  node, the newest).
The request gets a page of its own with the agreeing rows copied in (`DualPool.copy_rows`),
so nothing is shared and no lock outlives admission, which does the copy on the engine
thread before any step can read or write the page. Where no page is free, a tail is handed
over instead, its pages becoming the request's (the rows past the agreeing ones are
overwritten as the request computes them): making room would evict tails first, this one
among them.

Ownership: a tail's pages are the tree's (`PageBook`: parked, EVICTABLE, marked owned), so
the request that left it never frees them; they go back to the pools when the tail is
dropped: with its node (`Evictor._drop`), for a newer tail of the same node, or by eviction,
tails first and the least recently used first (a tail saves less than a page of
recomputation; a node's page saves a page and every longer match through it).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .node import Node
from .pages import PageBook


@dataclass(frozen=True)
class Tail:
    tokens: tuple[int, ...]     # 1 .. P - 1 tokens right after the node's end
    full: int                   # the page holding their full KV in its first rows
    swa: int | None             # and their SWA KV (None in full-kv mode)


@dataclass(frozen=True)
class PartialPage:
    """Rows [0, tokens) of `full` (and `swa`) hold the KV of the prompt's next `tokens`
    tokens after the match's end: a child's first page (`child`) or `node`'s tail."""
    node: Node
    full: int
    swa: int | None
    tokens: int
    child: Node | None = None


def agree(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token runs."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class TailBook:
    def __init__(self, pages: PageBook, hybrid: bool,
                 unmap: Callable[[list[int]], None] | None) -> None:
        self.pages, self.hybrid, self.unmap = pages, hybrid, unmap
        self._tails: OrderedDict[int, tuple[Node, Tail]] = OrderedDict()  # oldest use first

    def __len__(self) -> int:
        return len(self._tails)

    def of(self, node: Node) -> Tail | None:
        got = self._tails.get(id(node))
        return got[1] if got is not None else None

    def items(self) -> list[tuple[Node, Tail]]:
        return list(self._tails.values())

    def keep(self, node: Node, tail: Tail) -> None:
        """`node`'s tail is `tail` now (its pages become the tree's); an older one is
        dropped."""
        self.drop(node)
        self.pages.take_full([tail.full])
        if tail.swa is not None:
            self.pages.take_swa([tail.swa])
        self._tails[id(node)] = (node, tail)

    def touch(self, node: Node) -> None:
        if id(node) in self._tails:
            self._tails.move_to_end(id(node))

    def drop(self, node: Node) -> tuple[int, int]:
        """Free `node`'s tail, if it has one. Returns (full, SWA) pages freed."""
        got = self._tails.pop(id(node), None)
        return (0, 0) if got is None else self._free(got[1])

    def hand_over(self, node: Node) -> Tail:
        """Give `node`'s tail, pages and all, to a request (`PageBook.hand_over`)."""
        _, tail = self._tails.pop(id(node))
        self.pages.hand_over(tail.full, tail.swa)
        return tail

    def evict(self, full: int, swa: int) -> tuple[int, int]:
        """Drop the least recently used tails until `full` full and `swa` SWA pages are
        freed or none is left. Returns (full, SWA) pages freed."""
        ff = fs = 0
        while (ff < full or fs < swa) and self._tails:
            _, (_, tail) = self._tails.popitem(last=False)
            a, b = self._free(tail)
            ff, fs = ff + a, fs + b
        return ff, fs

    def _free(self, tail: Tail) -> tuple[int, int]:
        if tail.swa is not None:
            if self.unmap is not None:
                self.unmap([tail.full])
            self.pages.free_swa([tail.swa])
        self.pages.free_full([tail.full])
        return 1, int(tail.swa is not None)

    def partial(self, node: Node, rest: Sequence[int], P: int) -> PartialPage | None:
        """The source agreeing longest with `rest` (the prompt's tokens after `node.end`):
        `node`'s tail or a child's first page (in a hybrid tree only one whose SWA page is
        live). None when nothing agrees on a first token."""
        best: PartialPage | None = None
        if not rest:
            return None
        rest = rest[:P]
        first = rest[0]
        for key, child in node.children.items():
            if key[0] != first:
                continue
            swa = child.swa[0] if child.swa is not None else None
            if self.hybrid and (swa is None or swa < 0):
                continue
            t = agree(key, rest)
            if best is None or t > best.tokens:
                best = PartialPage(node, child.full[0], swa, t, child)
        tail = self.of(node)
        if tail is not None and tail.tokens[0] == first:
            t = agree(tail.tokens, rest)
            if best is None or t > best.tokens:
                best = PartialPage(node, tail.full, tail.swa, t)
        return best
