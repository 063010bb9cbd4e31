"""The two pools of a hybrid-SWA model and the pages each request holds in them.

Ownership: a `SeqKV` lists the pages its request holds; only `DualPool` moves pages between a
sequence and the allocators. Logical page p of a sequence covers token positions
[p * page_size, (p + 1) * page_size). Its full page is kept for the sequence's life; its SWA
page is released as soon as every position in it is older than the window, so a request
holds at most about window + chunk + one page of SWA slots whatever its length.

`full_to_swa[full_slot]` gives the SWA slot holding the same token's SWA-layer KV, or -1
(no SWA KV: never written, or released). The rest of the system addresses a sequence by
full slots; SWA layers translate through this map.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .allocator import OutOfPages
from .layout import KVLayout
from .pool import PagedKVPool


@dataclass
class SeqKV:
    full_pages: list[int] = field(default_factory=list)
    swa_pages: list[int | None] = field(default_factory=list)   # None: released
    swa_released: int = 0      # logical pages [0, swa_released) have no SWA page
    node: object = None        # prefix-cache node this request holds a lock on (or None)
    # Logical pages whose SWA a prefix cache wants offered when the request is inserted
    # (its retention checkpoints): window release holds them instead of freeing them.
    keep_swa: frozenset = frozenset()
    branch_len: int = 0        # where the request left the cached path at admission
    namespace: object = None   # its prefix-cache key space (None: plain token ids)
    # A window rebuild (RadixTree.match): the request holds the cache's full pages up to
    # `full_cached_to` but computes from `swa_floor` on. Its full layers must not write
    # positions below full_cached_to (the shared pages already hold that KV); its SWA
    # queries see no keys below swa_floor; its SWA KV is exact only from `swa_exact_from`
    # on, so pages starting earlier are never offered to the cache. Zeros otherwise.
    full_cached_to: int = 0
    swa_floor: int = 0
    swa_exact_from: int = 0
    lock_window: bool = True   # its cache lock covers the SWA window (False: rebuild lock)

    @property
    def capacity_tokens(self) -> int:
        return len(self.full_pages)

    def live_swa_pages(self) -> int:
        return sum(p is not None for p in self.swa_pages)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class DualPool:
    def __init__(self, layout: KVLayout, full_pages: int, swa_pages: int, page_size: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 allocate: bool = True):
        self.layout = layout
        self.page_size = page_size
        self.window = layout.window
        self.hybrid = layout.hybrid and bool(layout.swa)
        self.full = PagedKVPool("full", layout.full, full_pages, page_size, dtype, device, allocate)
        self.swa = PagedKVPool("swa", layout.swa, swa_pages if self.hybrid else 0, page_size,
                               dtype, device, allocate)
        self.full_to_swa = (torch.full((full_pages * page_size,), -1, dtype=torch.int64)
                            if allocate and self.hybrid else None)
        # Live SeqKVs by id. Holding the object keeps its id from being reused, so a sequence
        # dropped without free_seq stays counted (a leak shows) and a foreign one is caught.
        self._seqs: dict[int, SeqKV] = {}
        # Set by a prefix cache: pages it owns are shared, never freed by a sequence.
        self.cache_attached = False
        self.is_shared_full = lambda page: False
        self.is_shared_swa = lambda page: False

    # ---- sizing questions the scheduler asks -------------------------------------------
    def pages_to_grow(self, seq: SeqKV, new_len: int) -> tuple[int, int]:
        """(full, swa) pages `grow(seq, new_len)` would allocate. (They differ only for a
        window rebuild, whose full pages run ahead of its SWA pages.)"""
        n = _cdiv(new_len, self.page_size)
        need = max(n - len(seq.full_pages), 0)
        return need, (max(n - len(seq.swa_pages), 0) if self.hybrid else 0)

    def can_grow(self, seq: SeqKV, new_len: int, reserve: tuple[int, int] = (0, 0)) -> bool:
        f, s = self.pages_to_grow(seq, new_len)
        return (self.full.allocator.num_free - reserve[0] >= f
                and self.swa.allocator.num_free - reserve[1] >= s)

    # ---- page movement ----------------------------------------------------------------
    def new_seq(self) -> SeqKV:
        seq = SeqKV()
        self._seqs[id(seq)] = seq
        return seq

    def grow(self, seq: SeqKV, new_len: int) -> None:
        """Allocate pages so positions [0, new_len) have slots in both pools. All or nothing."""
        f, s = self.pages_to_grow(seq, new_len)
        if f == 0 and s == 0:
            return
        if self.full.allocator.num_free < f or self.swa.allocator.num_free < s:
            raise OutOfPages(f"need {f} full + {s} SWA pages; free "
                             f"{self.full.allocator.num_free} full, {self.swa.allocator.num_free} SWA")
        fp = self.full.allocator.alloc(f) if f else []
        sp = self.swa.allocator.alloc(s) if s else []
        first = len(seq.full_pages)
        seq.full_pages.extend(fp)
        if self.hybrid:
            # SWA pages beside full pages the request already held (a rebuild's, the prefix
            # cache's) stay unmapped: those full pages are shared, their map is the cache's.
            seq.swa_pages.extend(sp)
            if self.full_to_swa is not None:
                P = self.page_size
                ar = torch.arange(P)
                for j in range(first, len(seq.full_pages)):
                    fpage, spage = seq.full_pages[j], seq.swa_pages[j]
                    self.full_to_swa[fpage * P:(fpage + 1) * P] = spage * P + ar
        assert len(seq.full_pages) == first + f

    def release_window(self, seq: SeqKV, seq_len: int) -> int:
        """Free SWA pages every position of which is out of the window of the next query
        (position `seq_len` sees keys (seq_len - window, seq_len]). Pages the prefix cache
        owns are only dropped from the table (the cache frees them); pages in
        `seq.keep_swa` it does not own yet are held for the cache. Returns pages freed."""
        if not self.hybrid:
            return 0
        first_needed = seq_len - self.window + 1
        upto = min(max(first_needed, 0) // self.page_size, len(seq.swa_pages))
        freed, held = [], None
        for p in range(seq.swa_released, upto):
            sp = seq.swa_pages[p]
            if sp is None:
                continue
            if self.is_shared_swa(sp):
                seq.swa_pages[p] = None
            elif p in seq.keep_swa:
                held = p if held is None else held
            else:
                seq.swa_pages[p] = None
                freed.append(sp)
                self._unmap_if(seq.full_pages[p], sp)
        seq.swa_released = max(seq.swa_released, upto if held is None else held)
        self.swa.allocator.free(freed)
        return len(freed)

    def truncate(self, seq: SeqKV, new_len: int) -> int:
        """Roll back: free the pages wholly past position `new_len` in both pools (rejected
        draft tokens' KV). Such pages are never the prefix cache's (it only takes computed
        tokens) and never released (release trails the computed length). Returns pages freed."""
        keep = _cdiv(new_len, self.page_size)
        extra = seq.full_pages[keep:]
        if not extra:
            return 0
        assert not any(self.is_shared_full(p) for p in extra), "truncating cached KV"
        if self.hybrid:
            swa = seq.swa_pages[keep:]
            assert None not in swa and keep >= seq.swa_released, "truncating released SWA"
            for p in extra:
                self._unmap(p)
            self.swa.allocator.free(swa)
            del seq.swa_pages[keep:]
        self.full.allocator.free(extra)
        del seq.full_pages[keep:]
        return len(extra)

    def adopt(self, seq: SeqKV, full: dict[int, int], swa: dict[int, int]) -> None:
        """Point logical pages of `seq` at the prefix cache's copies of the same KV:
        `full` / `swa` map a logical page to the cache's page. The request's own pages they
        replace are freed (a request that recomputed tokens the cache already held, then
        moves its lock onto the cache's copy: see `PrefixCache.sync`)."""
        free_f, free_s = [], []
        for i, page in full.items():
            own = seq.full_pages[i]
            if own == page:
                continue
            assert not self.is_shared_full(own), "adopting over another cached page"
            self._unmap(own)
            free_f.append(own)
            seq.full_pages[i] = page
        for i, page in swa.items():
            own = seq.swa_pages[i]
            if own is None or own == page:
                continue            # released: the request no longer reads it
            assert not self.is_shared_swa(own), "adopting over another cached SWA page"
            self._unmap_if(seq.full_pages[i], own)
            free_s.append(own)
            seq.swa_pages[i] = page
        self.full.allocator.free(free_f)
        self.swa.allocator.free(free_s)

    def free_seq(self, seq: SeqKV) -> None:
        """Return every page the sequence holds (not the prefix cache's). A sequence is
        freed exactly once."""
        if self._seqs.get(id(seq)) is not seq:
            raise RuntimeError("freeing a sequence this pool does not own (double free?)")
        del self._seqs[id(seq)]
        live = []
        for p, sp in enumerate(seq.swa_pages):
            if sp is not None and not self.is_shared_swa(sp):
                live.append(sp)
                self._unmap_if(seq.full_pages[p], sp)
        self.swa.allocator.free(live)
        own_full = [p for p in seq.full_pages if not self.is_shared_full(p)]
        for p in own_full:
            self._unmap(p)
        self.full.allocator.free(own_full)
        seq.full_pages, seq.swa_pages, seq.swa_released = [], [], 0
        seq.keep_swa = frozenset()

    def unmap_full_pages(self, full_pages) -> None:
        """The prefix cache freed the SWA KV of these (cached) full pages."""
        for p in full_pages:
            self._unmap(p)

    def map_pages(self, full_page: int, swa_page: int) -> None:
        """Record that `swa_page` holds the SWA KV of `full_page`'s tokens."""
        if self.full_to_swa is not None:
            P = self.page_size
            self.full_to_swa[full_page * P:(full_page + 1) * P] = swa_page * P + torch.arange(P)

    def _unmap_if(self, full_page: int, swa_page: int) -> None:
        """Unmap `full_page` if it still maps to `swa_page` (a cached full page may have
        been re-paired with the cache's own SWA page meanwhile)."""
        if self.full_to_swa is not None:
            P = self.page_size
            if int(self.full_to_swa[full_page * P]) == swa_page * P:
                self.full_to_swa[full_page * P:(full_page + 1) * P] = -1

    def _unmap(self, full_page: int) -> None:
        if self.full_to_swa is not None:
            P = self.page_size
            self.full_to_swa[full_page * P:(full_page + 1) * P] = -1

    # ---- addressing ---------------------------------------------------------------------
    def full_slots(self, seq: SeqKV, start: int, end: int) -> torch.Tensor:
        pos = torch.arange(start, end)
        pages = torch.tensor(seq.full_pages, dtype=torch.int64)
        return pages[pos // self.page_size] * self.page_size + pos % self.page_size

    def swa_slots(self, seq: SeqKV, start: int, end: int) -> torch.Tensor:
        """SWA slots of positions [start, end); every one must still be live."""
        if not self.hybrid:
            return self.full_slots(seq, start, end)
        pos = torch.arange(start, end)
        lp = pos // self.page_size
        pages = torch.tensor([-1 if p is None else p for p in seq.swa_pages], dtype=torch.int64)
        sp = pages[lp]
        if start < end and bool((sp < 0).any()):
            raise RuntimeError(f"SWA KV for positions [{start}, {end}) was already released")
        return sp * self.page_size + pos % self.page_size

    # ---- accounting ---------------------------------------------------------------------
    def check_integrity(self) -> None:
        self.full.check_integrity()
        self.swa.check_integrity()
        if self.full_to_swa is not None:
            if self.cache_attached:
                mapped = torch.unique(self.full_to_swa[self.full_to_swa >= 0]).numel()
                held = self.swa.allocator.num_in_use + self.swa.allocator.num_evictable
                assert mapped <= held * self.page_size, \
                    "full->SWA map points at SWA slots no one holds"
            else:
                mapped = int((self.full_to_swa >= 0).sum())
                assert mapped == self.swa.allocator.num_in_use * self.page_size, \
                    "full->SWA map disagrees with the SWA pool's pages in use"

    @property
    def num_live_seqs(self) -> int:
        return len(self._seqs)

    def stats(self) -> dict:
        return {"full": self.full.allocator.stats(), "swa": self.swa.allocator.stats()}
