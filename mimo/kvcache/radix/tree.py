"""SWA-aware radix tree over page-aligned token keys (DESIGN.md section 4).

Each node holds a segment of whole pages: its tokens, one full page per page of tokens and
one SWA page per page, or a tombstone where it has none (NO_SWA: never kept; EVICTED_SWA:
freed by SWA-only eviction; either way the full KV stays so the prefix still serves longer
matches). Keys live under a per-namespace root (media hashes, cache salt): equal tokens in
different namespaces never share KV.

Invariants (all checked by `check_integrity`):
- a page is held by at most one node; a held page is IN_USE in its allocator while a lock
  covers it and EVICTABLE (parked) otherwise; the tree is the only one that parks pages;
- full locks cover a locked node and its ancestors (`lock_ref`); SWA locks cover only the
  window before a locked node's end (`swa_lock`), so SWA outside a running request's window
  can still be freed; and only while the request reads it: once decoding has moved past a
  page of that window, `unpin` lets go of it;
- every leaf's end is reachable (window-safe): insert trims to the last safe point, SWA
  eviction never frees a protected leaf's tail window, evicting a leaf trims its parent.
  Relaxed with window rebuild: a leaf longer than a receptive field may lose its window
  (`Evictor.protects`), and one under a rebuild lock or an `unpin`ned lock may end in
  a dead window (unlocking trims it);
- a node's end never changes once created: splitting makes a new node for the *prefix*, so
  references held in `MatchResult.node` stay valid.

SWA priorities (the SWA LRU order): a window's time is its last use as a match end. Two
kinds start handicapped by SPECULATIVE, so they only hold SWA room nothing else wants
until a match ends at them: windows kept only by the policy's dense grid, and a leaf's
tail window once a longer request extends that path (the conversation moved on: later
turns match the new end; the old one is only a fallback for forks). But the windows a
running request's prefill chunks leave keep their write time until it ends (then those
not its checkpoints are demoted): else its later chunks evict them before idle windows.

Modes: 'hybrid' (SWA pool, window-safe matching), 'full-kv' (the pre-SWA baseline: one pool
holding every layer, every cached prefix reusable) and 'off' (no caching).

`RadixTree` is inserts plus a composition, each part with its own state: `Paths` (the
shape: roots, walk, split, window arithmetic), `LRU` (the clock and the two lazy heaps),
`PageBook` (which pages the tree holds), `Matcher` (match, peek), `Evictor` (eviction,
leaf trimming, the listeners told of it), `LockTable` (locks, unpin), `HoldBook`
(paused sessions) and `TailBook` (partial last pages, whose first rows a request copies:
tails.py); check.py asserts the invariants.
"""
from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from ..pool.allocator import PageAllocator
from .check import check_integrity
from .evict import EvictHook, Evictor, TreeListener
from .hold import HoldBook
from .lock import LockTable
from .lru import LRU
from .match import Matcher
from .node import NO_SWA, PROTECTED, SPECULATIVE, InsertResult, MatchResult, Node
from .pages import PageBook
from .paths import Path, Paths
from .retention import RetentionPolicy
from .tails import PartialPage, Tail, TailBook

MODES = ("hybrid", "full-kv", "off")
__all__ = ["MODES", "NO_SWA", "PROTECTED", "SPECULATIVE", "InsertResult", "MatchResult", "Node",
           "PartialPage", "RadixTree", "TreeListener"]


def _live(page: int | None) -> bool:
    return page is not None and page >= 0


def _kept(page: int | None, keep: bool) -> int:
    """The page a new node keeps as its SWA, or the tombstone NO_SWA."""
    return page if keep and page is not None and page >= 0 else NO_SWA


@dataclass(frozen=True)
class InsertPlan:
    cached: int             # pages of the sequence the tree had (token-equal) before
    end: int                # pages kept: the policy's cached end, cut back to window-safe
    cps: list[int]          # the checkpoints (tokens)
    branch: int             # where the sequence left the cached path (checkpoints use it)
    keep: set[int]          # logical pages whose SWA the tree keeps
    firm: set[int]          # of those, the ones not speculative
    spare: set[int]         # of those, the ones no checkpoint's window needs (`spare`)
    revive: bool            # False: a sync; the request goes on computing this path
    now: int                # the insert's tick (+ PROTECTED for a session)

    @property
    def running(self) -> bool:
        return not self.revive


class RadixTree:
    def __init__(self, page_size: int, window: int, full_alloc: PageAllocator,
                 swa_alloc: PageAllocator | None = None, policy: RetentionPolicy | None = None,
                 mode: str = "hybrid", unmap: Callable[[list[int]], None] | None = None,
                 rebuild: int = 0) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if mode == "hybrid" and swa_alloc is None:
            raise ValueError("hybrid mode needs an SWA allocator")
        self.P, self.W, self.mode = page_size, window, mode
        self.hybrid = mode == "hybrid"
        # The SWA receptive field (tokens) its users rebuild windows with, 0: no rebuild
        # (`match`). Besides the default for matches, it decides which leaves may end where
        # their window is gone (see the invariants above and `Evictor.protects`).
        self.rebuild = rebuild if self.hybrid else 0
        self.full_alloc, self.swa_alloc = full_alloc, swa_alloc
        self.policy = policy or RetentionPolicy()
        self.counters = dict(matches=0, matched_tokens=0, prefix_tokens=0, evicted_full=0,
                             evicted_swa=0, tombstoned_swa=0, revived_swa=0, held=0,
                             cut_never_kept=0, cut_evicted=0, rebuilt_tokens=0, reheaps=0,
                             partial_tokens=0)
        on = mode != "off"
        self.lru = LRU(self.hybrid)
        self.paths = Paths(page_size, window, self.hybrid, self.lru)
        self.pages = PageBook(full_alloc, swa_alloc if self.hybrid else None)
        self.matcher = Matcher(self.paths, self.lru, self.counters, on, self.rebuild)
        self.tails = TailBook(self.pages, self.hybrid, unmap)
        self.evictor = Evictor(self.paths, self.lru, self.pages, self.counters, self.rebuild,
                               unmap, self.tails)
        self.locks = LockTable(self.paths, self.lru, self.pages, self.evictor)
        self.holds = HoldBook(self.paths, self.lru, self.counters, on)

    # ---- the parts' faces ------------------------------------------------------------------
    @property
    def on_evict(self) -> EvictHook | None:
        """Called with (node, local full pages, local SWA pages) just before eviction frees
        them (`Evictor.slot`; the listeners after it)."""
        return self.evictor.on_evict

    @on_evict.setter
    def on_evict(self, fn: EvictHook | None) -> None:
        self.evictor.slot = fn

    @property
    def listeners(self) -> list[TreeListener]:
        """Told of every insert and, after `on_evict`, of every eviction."""
        return self.evictor.listeners

    @property
    def clock(self) -> Callable[[], float]:
        """Seconds, for holds (`HoldBook`)."""
        return self.holds.clock

    @clock.setter
    def clock(self, fn: Callable[[], float]) -> None:
        self.holds.clock = fn

    def match(self, tokens: Sequence[int], namespace: Hashable = None, count: bool = True,
              rebuild: int | None = None) -> MatchResult:
        return self.matcher.match(tokens, namespace, count, rebuild)

    def peek(self, tokens: Sequence[int], namespace: Hashable = None,
             rebuild: int | None = None) -> int:
        return self.matcher.peek(tokens, namespace, rebuild)

    def lock(self, node: Node | None, window: bool = True) -> None:
        self.locks.lock(node, window)

    # ---- partial pages (tails.py) ----------------------------------------------------------
    def partial(self, m: MatchResult, tokens: Sequence[int]) -> PartialPage | None:
        """Where the first rows of the page after a match's end are cached: the rows of
        `tokens` (what was matched) past `m.length` that a child's first page or the end
        node's tail agrees on. None without a whole page matched (a prompt's first tokens,
        a chat template's, agree with most others: a few rows, not worth a page and a copy),
        for a window rebuild, or where the cached path runs on past the window-safe end
        (the next page's SWA is gone: its rows are no use)."""
        if (self.mode == "off" or m.node is None or not m.length or m.rebuild
                or m.prefix_len != m.length):
            return None
        return self.tails.partial(m.node, tokens[m.length:], self.P)

    def still_holds(self, part: PartialPage) -> bool:
        """Whether the tree still holds a partial page's source pages (eviction may have
        freed them since `partial` found them)."""
        return self.pages.owns_full(part.full) and (part.swa is None
                                                    or self.pages.owns_swa(part.swa))

    def touch(self, part: PartialPage) -> None:
        """A request is about to copy this partial page's rows: the youngest of its order
        (the tails', or the leaves' for a child), so making room for the copy takes it last."""
        if part.child is None:
            self.tails.touch(part.node)
        else:
            part.child.time = self.lru.tick()
            self.lru.push_leaf(part.child)

    def reused(self, part: PartialPage) -> None:
        """A request got the partial page's rows (`partial_tokens` counts them)."""
        self.counters["partial_tokens"] += part.tokens

    def hand_over(self, part: PartialPage) -> None:
        """A tail's pages become the requesting request's own (see tails.py)."""
        assert part.child is None, "only a tail is handed over; a child's page stays"
        self.tails.hand_over(part.node)

    def keep_tail(self, tokens: Sequence[int], tail: Sequence[int], full: int,
                  swa: int | None, namespace: Hashable = None) -> bool:
        """Keep a finished request's partial last page: `tail` (1 .. P - 1 tokens) follows
        `tokens` (whole pages, already inserted), its KV in the first rows of `full` (and
        `swa`, hybrid mode). Kept only where the cached path equal to `tokens` ends at a
        node's end, window-safe, and no child's first page already serves those rows; the
        pages are the tree's then. Returns whether it was kept."""
        P = self.P
        if (self.mode == "off" or not tokens or not 0 < len(tail) < P or len(tokens) % P
                or (self.hybrid and (swa is None or swa < 0))):
            return False
        root = self.paths.root(namespace)
        if root is None:
            return False
        path, m, q = self.matcher.lookup(root, tokens)
        if m != len(tokens) or q * P != m or path[-1][1] != len(path[-1][0].full):
            return False
        node = path[-1][0]
        if self.pages.owns_full(full) or (swa is not None and self.pages.owns_swa(swa)):
            return False
        best = self.tails.partial(node, tail, P)
        if best is not None and best.child is not None and best.tokens >= len(tail):
            return False
        self.tails.keep(node, Tail(tuple(tail), full, swa if self.hybrid else None))
        return True

    def unlock(self, node: Node | None, window: bool = True, fix: bool = True,
               unpinned: int = 0) -> None:
        self.locks.unlock(node, window, fix, unpinned)

    def unpin(self, node: Node | None, lo: int, hi: int) -> None:
        self.locks.unpin(node, lo, hi)

    def window_of(self, node: Node | None) -> list[tuple[int, int]]:
        return self.locks.window_of(node)

    def hold(self, tokens: Sequence[int], namespace: Hashable = None, seconds: float = 0.0,
             protect: bool = False) -> int:
        return self.holds.hold(tokens, namespace, seconds, protect)

    def expire_holds(self) -> int:
        return self.holds.expire()

    @property
    def num_holds(self) -> int:
        return len(self.holds)

    def evict(self, full: int = 0, swa: int = 0) -> tuple[int, int]:
        """Free at least `full` full and `swa` SWA pages (`Evictor.evict`), holds whose
        time is up ended first."""
        self.holds.expire()
        return self.evictor.evict(full, swa)

    def owns_full(self, page: int) -> bool:
        """Whether the tree holds this full page (a request must never free it)."""
        return self.pages.owns_full(page)

    def owns_swa(self, page: int) -> bool:
        return self.hybrid and self.pages.owns_swa(page)

    def namespace_of(self, root: Node) -> Hashable:
        return self.paths.namespace_of(root)

    def num_leaves(self) -> int:
        """Cached sequence ends: each holds a tail window in hybrid mode (the SWA pool's
        floor, `cache_sim.size_swa_share`)."""
        return sum(not n.children for n in self.paths.nodes())

    def path_pages(self, tokens: Sequence[int],
                   namespace: Hashable = None) -> tuple[list[int], list[int]]:
        """(full pages, SWA pages) along the cached path equal to `tokens` (whole pages), SWA
        entries < 0 where tombstoned (NO_SWA / EVICTED_SWA; full-kv mode: all NO_SWA).
        Read-only: no split, no touch, no count. The pages stay the tree's."""
        path = self.path_nodes(tokens, namespace)
        full = [p for n, k in path for p in n.full[:k]]
        swa = ([s for n, k in path for s in (n.swa or [])[:k]] if self.hybrid
               else [NO_SWA] * len(full))
        return full, swa

    def path_nodes(self, tokens: Sequence[int], namespace: Hashable = None) -> Path:
        """(node, pages of it on the path) along the cached path equal to `tokens`."""
        root = self.paths.root(namespace)
        if self.mode == "off" or root is None:
            return []
        toks = self.paths.tok(tokens)
        return self.paths.walk(root, toks, len(toks) // self.P)[0]

    def check_integrity(self) -> None:
        check_integrity(self)

    def stats(self) -> dict[str, Any]:
        nodes = list(self.paths.nodes())
        swa = [s for n in nodes for s in (n.swa or ())]
        out: dict[str, Any] = {
            "mode": self.mode, "nodes": len(nodes),
            "cached_tokens": sum(len(n.tokens) for n in nodes),
            "full_pages": sum(len(n.full) for n in nodes),
            "swa_live_pages": sum(s >= 0 for s in swa),
            "swa_tombstones": sum(s < 0 for s in swa),
            "locked_nodes": sum(n.lock_ref > 0 for n in nodes),
            "tails": len(self.tails),
            "full_pool": self.full_alloc.stats()}
        if self.swa_alloc is not None:
            out["swa_pool"] = self.swa_alloc.stats()
        out.update(self.counters)
        return out

    # ---- insert ------------------------------------------------------------------------
    def checkpoints(self, total_len: int, prompt_len: int | None, branch_len: int) -> list[int]:
        return self.policy.checkpoints(total_len, prompt_len, branch_len, self.P)

    def spare_swa(self, page: int) -> bool:
        """Whether an SWA page the tree holds is kept only as spare (no checkpoint's window:
        retention.py), which the tiers leave in L1."""
        return self.pages.is_spare(page)

    def keep_pages(self, total_len: int, prompt_len: int | None, branch_len: int) -> set[int]:
        """Logical pages whose SWA a running request must not release: window release
        skips them so insert can keep them (branch_len: `MatchResult.prefix_len`)."""
        if self.policy.keep_all:
            return set(range(-(-total_len // self.P)))
        return self.policy.keep_pages(self.checkpoints(total_len, prompt_len, branch_len),
                                      self.W, self.P)

    def insert(self, tokens: Sequence[int], full_pages: list[int],
               swa_pages: Sequence[int | None] | None = None, namespace: Hashable = None,
               prompt_len: int | None = None, revive: bool = True,
               branch_len: int | None = None, protect: bool = False) -> InsertResult:
        """Hand a finished (or preempted) request's pages to the tree.

        `full_pages[i]` / `swa_pages[i]` hold the KV of tokens [i*P, (i+1)*P) (released SWA:
        None or NO_SWA). Afterwards each page passed is the tree's or listed in `dup_*` for
        the caller to free, never both; the caller then unlocks its match node. Kept: pages
        up to the policy's cached end (cut back to the last window-safe point), SWA only on
        its checkpoint windows; recomputed tombstones are revived (`remap`: a full->SWA map
        must follow), not with `revive=False` (a running request could not lock them).
        `branch_len`: where the request left the cached path at admission (default: where
        `tokens` leave it now). `protect`: a session's KV, stamped PROTECTED ticks younger."""
        P = self.P
        if len(full_pages) > -(-len(tokens) // P):
            raise ValueError(f"{len(full_pages)} pages for {len(tokens)} tokens: pass the "
                             "tokens whose KV the pages hold")
        swa = list(swa_pages or []) + [None] * (len(full_pages) - len(swa_pages or []))
        caller_swa = [s for s in swa if s is not None and s >= 0]
        if self.mode == "off":
            return InsertResult(list(full_pages), caller_swa, [], 0)
        now, toks = self.lru.tick() + (PROTECTED if protect else 0), self.paths.tok(tokens)
        root = self.paths.root(namespace, create=True)
        assert root is not None             # create=True
        path, m = self.paths.walk(root, toks, min(len(full_pages), len(toks) // P))
        plan = self._plan(len(toks), path, m, swa, prompt_len, branch_len, revive, now)
        if self._split_spare(path, plan):
            path, m = self.paths.walk(root, toks, min(len(full_pages), len(toks) // P))
        remap = self._refresh_cached(path, full_pages, swa, plan)
        if plan.end > plan.cached:          # the new part: new nodes split at checkpoints
            self._add_new(root, path, toks, full_pages, swa, plan, prompt_len)
        for li in self.listeners:
            li.inserted(toks, namespace)
        return InsertResult(self.pages.not_held_full(full_pages),
                            self.pages.not_held_swa(caller_swa) if self.hybrid else caller_swa,
                            remap, max(plan.end, plan.cached) * P)

    def _plan(self, n_tokens: int, path: Path, m: int, swa: list[int | None],
              prompt_len: int | None, branch_len: int | None, revive: bool,
              now: int) -> InsertPlan:
        """What an insert keeps: up to the policy's cached end, cut back to the last point
        whose window is live (in the tree, or passed in where it will be kept)."""
        P, mq = self.P, m // self.P
        end = self.policy.cache_len(n_tokens, P, prompt_len) // P
        branch = m if branch_len is None else branch_len
        cps = self.checkpoints(n_tokens, prompt_len, branch)
        keep, firm, spare = set[int](), set[int](), set[int]()    # empty without SWA pools
        if self.hybrid:
            pol = self.policy
            keep = set(range(end)) if pol.keep_all else pol.keep_pages(cps, self.W, P)
            firm = keep if pol.keep_all else pol.keep_pages(
                pol.checkpoints(n_tokens, prompt_len, branch, P, firm_only=True), self.W, P)
            if pol.spare:
                # the new pages' live SWA offered beyond the checkpoints' (a prefill's
                # chunk behind its window): kept at speculative priority (retention.py)
                spare = {i for i in range(mq, end) if i not in keep and _live(swa[i])}
                keep = keep | spare
            tree_swa = [s for nd, k in path for s in (nd.swa or [])[:k]]
            live = [(i < mq and tree_swa[i] >= 0)
                    or ((revive or i >= mq) and i in keep and _live(swa[i]))
                    for i in range(end)]
            end = self.paths.safe_pages(live, end)
        return InsertPlan(mq, end, cps, branch, keep, firm, spare, revive, now)

    def _refresh_cached(self, path: Path, full_pages: list[int], swa: list[int | None],
                        plan: InsertPlan) -> list[tuple[int, int]]:
        """The part already cached: touch it, demote the windows the request's own chunks
        left there (none of its checkpoints: see SWA priorities), and revive tombstones it
        recomputed that retention keeps. Returns the remap of revived pages."""
        remap: list[tuple[int, int]] = []
        revived: list[tuple[Node, int]] = []
        base = 0
        for nd, k in path:
            nd.time = plan.now
            self.lru.push_leaf(nd)
            if (self.hybrid and not plan.running and nd.start >= plan.branch and nd.swa
                    and not any(base + i in plan.firm for i in range(k))):
                nd.swa_time = min(nd.swa_time, plan.now - SPECULATIVE)
                self.lru.push_swa(nd)
            for i in range(k) if self.hybrid and self.policy.spare else ():
                assert nd.swa is not None
                if base + i in plan.keep and nd.swa[i] >= 0 and self.pages.is_spare(nd.swa[i]):
                    # a checkpoint's window on pages an earlier prefill left spare (its
                    # node was split there: _split_spare): a window like any other now
                    self.pages.mark_spare([nd.swa[i]], False)
                    if base + i in plan.firm:
                        revived.append((nd, base + i))
            for i in range(k) if self.hybrid and plan.revive else ():
                g, s = base + i, swa[base + i]
                assert nd.swa is not None
                if s is None or s < 0 or nd.swa[i] >= 0 or g not in plan.keep:
                    continue
                nd.swa[i] = s
                self.pages.take_swa([s])
                self.counters["revived_swa"] += 1
                if full_pages[g] != nd.full[i]:
                    remap.append((nd.full[i], s))
                revived.append((nd, g))
            base += k
        for nd, g in revived:
            if g in plan.firm:
                nd.swa_time = plan.now
            self.lru.push_swa(nd)
        return remap

    def _split_spare(self, path: Path, plan: InsertPlan) -> bool:
        """Split the path's nodes holding spare SWA where this insert's kept windows begin
        and end, so that a window landing on spare pages gets a node (and a priority) of
        its own. Returns whether anything was split (the caller walks the path again)."""
        if not (self.hybrid and self.policy.spare and plan.keep):
            return False
        split, base = False, 0
        for nd, k in path:
            assert nd.swa is not None
            cuts = [i for i in range(1, k)
                    if (base + i in plan.keep) != (base + i - 1 in plan.keep)]
            if cuts and any(s >= 0 and self.pages.is_spare(s) for s in nd.swa[:k]):
                node = nd
                for i in reversed(cuts):        # each split keeps `node` as the suffix
                    pre = self.paths.split(node, i)
                    if base + i - 1 not in plan.keep:
                        # spare pages ending where no match ended: speculative again (a
                        # match ending further on may have promoted the node they were in)
                        pre.swa_time = min(pre.swa_time, plan.now - SPECULATIVE)
                        self.lru.push_swa(pre)
                    node = pre
                split = True
            base += k
        return split

    def _add_new(self, root: Node, path: Path, toks: array[int], full_pages: list[int],
                 swa: list[int | None], plan: InsertPlan, prompt_len: int | None) -> None:
        """The new part, pages [plan.cached, plan.end): new nodes under the path's end,
        split at the checkpoints."""
        P, now = self.P, plan.now
        parent = root
        if path:
            last, k = path[-1]
            parent = self.paths.split(last, k) if k < len(last.full) else last
            if (parent is last and not last.children and self.hybrid
                    and not (plan.running and last.end > plan.branch)):
                # A conversation continued past its cached end: later turns will match
                # the new end; the old window is only a fallback for forks now. Unless
                # that end is this sequence's own prompt end (a running request that
                # inserted its prompt now adds its output): then it is firm.
                own_prompt = (self.policy.prompt and prompt_len is not None
                              and last.end in self.policy.prompt_points(prompt_len, P))
                last.swa_time = now if own_prompt else now - SPECULATIVE
                # Its new time needs its own heap entry (the window below may not
                # reach into it: with W = 1 a window lies past the node's end).
                self.lru.push_swa(last)
                # No longer a leaf, it protects no tail window: the nodes holding that
                # window may have left the SWA heap while protected.
                self.evictor.push_window(last)
        cuts = {c // P for c in plan.cps if plan.cached < c // P < plan.end} | {plan.end}
        if plan.spare:
            # spare pages in nodes of their own: a node's SWA priority is its firmest page's
            cuts |= {i for i in range(plan.cached + 1, plan.end)
                     if (i in plan.spare) != (i - 1 in plan.spare)}
        bounds = sorted(cuts)
        lo = plan.cached
        for hi in bounds:
            node_swa = None
            if self.hybrid:
                node_swa = [_kept(swa[i], i in plan.keep) for i in range(lo, hi)]
            nd = Node(parent, toks[lo * P:hi * P], list(full_pages[lo:hi]), node_swa, lo * P,
                      now)
            parent.children[tuple(nd.tokens[:P])] = nd
            self.pages.take_full(nd.full)
            if node_swa is not None:
                self.pages.take_swa([s for s in node_swa if s >= 0])
                if lo in plan.spare:                # (the whole node: cut there)
                    self.pages.mark_spare([s for s in node_swa if s >= 0])
                if not any(i in plan.firm for i in range(lo, hi)):
                    nd.swa_time = now - SPECULATIVE   # older than anything firm
                self.lru.push_swa(nd)
            parent, lo = nd, hi
        self.lru.push_leaf(parent)

