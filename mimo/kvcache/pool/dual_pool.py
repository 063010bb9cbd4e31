"""The two pools of a hybrid-SWA model and the pages each request holds in them.

Ownership: a `SeqKV` lists the pages its request holds; only `DualPool` moves pages between a
sequence and the allocators. A request's full page is kept for the sequence's life; its SWA
page is released as soon as every position in it is older than the window, so a request
holds at most about window + chunk + one page of SWA slots whatever its length. Pages a
prefix cache shares with requests are the cache's: the pool learns which through the one
`PageOwner` attached to it (`attach_owner`) and never frees them for a request.

With storage (`allocate=True`) the pool also keeps `full_to_swa` (`SlotMap`: full slot ->
SWA slot of the same token, -1 where there is no SWA KV) in step with the page tables. The
rest of the system addresses a sequence by full slots; SWA layers translate through it.
Without storage the pool is bookkeeping only and never imports torch.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .allocator import OutOfPages
from .kv_pool import KVPool
from .layout import KVLayout
from .page_owner import NO_OWNER, PageOwner
from .seq_kv import SeqKV

if TYPE_CHECKING:
    import torch

    from .slot_map import SlotMap

__all__ = ["DualPool", "SeqKV"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class DualPool:
    def __init__(self, layout: KVLayout, full_pages: int, swa_pages: int, page_size: int,
                 dtype: torch.dtype | None = None, device: str | torch.device = "cpu",
                 allocate: bool = True):
        """`dtype` (default float32) and `device`: of the K/V storage, which exists only
        with `allocate`."""
        self.layout = layout
        self.page_size = page_size
        self.window = layout.window
        self.hybrid = layout.hybrid and bool(layout.swa)
        swa_pages = swa_pages if self.hybrid else 0
        full_kv = swa_kv = None
        self._map: SlotMap | None = None
        if allocate:
            # Storage is torch's: imported here so bookkeeping-only pools never load it.
            from .kv_tensors import KVTensors
            from .slot_map import SlotMap
            full_kv = KVTensors(layout.full, full_pages * page_size, dtype, device)
            swa_kv = KVTensors(layout.swa, swa_pages * page_size, dtype, device)
            if self.hybrid:
                self._map = SlotMap(full_pages, page_size)
        self.full = KVPool("full", layout.full, full_pages, page_size, full_kv)
        self.swa = KVPool("swa", layout.swa, swa_pages, page_size, swa_kv)
        # Live SeqKVs by id. Holding the object keeps its id from being reused, so a sequence
        # dropped without free_seq stays counted (a leak shows) and a foreign one is caught.
        self._seqs: dict[int, SeqKV] = {}
        self._owner: PageOwner = NO_OWNER

    # ---- page ownership -----------------------------------------------------------------
    def attach_owner(self, owner: PageOwner) -> None:
        """Share pages with `owner` (a prefix cache): from now on a page it owns is never
        freed by a request (`free_seq`, window release, rollback, adopt). One owner per
        pool, attached before any request holds pages."""
        if self._owner is not NO_OWNER:
            raise RuntimeError("this pool already shares its pages with an owner")
        if self._seqs:
            raise RuntimeError("attach the page owner before any request holds pages")
        self._owner = owner

    @property
    def has_owner(self) -> bool:
        return self._owner is not NO_OWNER

    def is_shared_full(self, page: int) -> bool:
        """Whether a full page in some request's table is the owner's, not the request's."""
        return self._owner.owns_full(page)

    def is_shared_swa(self, page: int) -> bool:
        return self._owner.owns_swa(page)

    @property
    def full_to_swa(self) -> torch.Tensor | None:
        """The full -> SWA slot map (None without storage or without SWA layers)."""
        return None if self._map is None else self._map.table

    # ---- sizing questions the scheduler asks -------------------------------------------
    def pages_to_grow(self, seq: SeqKV, new_len: int) -> tuple[int, int]:
        """(full, swa) pages `grow(seq, new_len)` would allocate. (They differ only for a
        window rebuild, whose full pages run ahead of its SWA pages.)"""
        n = _cdiv(new_len, self.page_size)
        need = max(n - len(seq.full_pages), 0)
        return need, (max(n - len(seq.swa_pages), 0) if self.hybrid else 0)

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
            if self._map is not None:
                for j in range(first, len(seq.full_pages)):
                    spage = seq.swa_pages[j]
                    assert spage is not None    # beside a new full page: new in both pools
                    self._map.map(seq.full_pages[j], spage)
        assert len(seq.full_pages) == first + f

    def grow_imported(self, seq: SeqKV, new_len: int, swa_first_page: int) -> None:
        """Pages for KV computed elsewhere (a transferred prompt, see kv_payload): full pages
        for [0, new_len), SWA pages only from `swa_first_page` on, the older ones already
        released. `seq` must hold nothing yet. All or nothing."""
        if seq.full_pages or seq.swa_pages:
            raise RuntimeError("grow_imported needs a sequence that holds no pages")
        n = _cdiv(new_len, self.page_size)
        first = min(swa_first_page, n) if self.hybrid else 0
        s = n - first if self.hybrid else 0
        if self.full.allocator.num_free < n or self.swa.allocator.num_free < s:
            raise OutOfPages(f"need {n} full + {s} SWA pages; free "
                             f"{self.full.allocator.num_free} full, {self.swa.allocator.num_free} SWA")
        seq.full_pages = self.full.allocator.alloc(n) if n else []
        if self.hybrid:
            sp = self.swa.allocator.alloc(s) if s else []
            seq.swa_pages = [None] * first + list(sp)
            seq.swa_released = first
            if self._map is not None:
                for j in range(first, n):
                    self._map.map(seq.full_pages[j], sp[j - first])

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
            self.swa.allocator.free(p for p in swa if p is not None)    # (all, asserted)
            del seq.swa_pages[keep:]
        self.full.allocator.free(extra)
        del seq.full_pages[keep:]
        return len(extra)

    def adopt(self, seq: SeqKV, full: dict[int, int], swa: dict[int, int]) -> None:
        """Point logical pages of `seq` at the prefix cache's copies of the same KV:
        `full` / `swa` map a logical page to the cache's page. The request's own pages they
        replace are freed (a request that recomputed tokens the cache already held, then
        moves its lock onto the cache's copy: see `RadixPrefixCache.sync`)."""
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
            own_swa = seq.swa_pages[i]
            if own_swa is None or own_swa == page:
                continue            # released: the request no longer reads it
            assert not self.is_shared_swa(own_swa), "adopting over another cached SWA page"
            self._unmap_if(seq.full_pages[i], own_swa)
            free_s.append(own_swa)
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

    def unmap_full_pages(self, full_pages: Iterable[int]) -> None:
        """The prefix cache freed the SWA KV of these (cached) full pages."""
        for p in full_pages:
            self._unmap(p)

    def map_pages(self, full_page: int, swa_page: int) -> None:
        """Record that `swa_page` holds the SWA KV of `full_page`'s tokens."""
        if self._map is not None:
            self._map.map(full_page, swa_page)

    def _unmap_if(self, full_page: int, swa_page: int) -> None:
        if self._map is not None:
            self._map.unmap_if(full_page, swa_page)

    def _unmap(self, full_page: int) -> None:
        if self._map is not None:
            self._map.unmap(full_page)

    def attach(self, seq: SeqKV, full: int, swa: int | None) -> None:
        """Append a page the prefix cache handed over (IN_USE, no longer the cache's) to
        the request's tables as its next logical page, its own from now on."""
        if self.is_shared_full(full) or (swa is not None and self.is_shared_swa(swa)):
            raise RuntimeError("attaching a page the prefix cache still owns")
        if self.hybrid:
            if swa is None or len(seq.swa_pages) != len(seq.full_pages):
                raise RuntimeError("attaching a page needs its SWA page, after the last one")
            seq.swa_pages.append(swa)
            if self._map is not None:
                self._map.map(full, swa)
        seq.full_pages.append(full)

    def copy_rows(self, seq: SeqKV, page: int, full: int, swa: int | None, n: int) -> None:
        """Copy the first `n` rows of every layer's K/V from the prefix cache's pages `full`
        (and `swa`) into the request's own logical page `page` (a partial page's reuse:
        radix/tails.py). Bookkeeping-only pools have nothing to copy."""
        P = self.page_size
        if not 0 < n <= P:
            raise ValueError(f"copying {n} rows of a {P}-row page")
        if seq.full_pages[page] == full or self.is_shared_full(seq.full_pages[page]):
            raise RuntimeError("copying rows into a page the request does not own")
        pairs = [(self.full, seq.full_pages[page], full)]
        if self.hybrid:
            own = seq.swa_pages[page]
            if swa is None or own is None or self.is_shared_swa(own):
                raise RuntimeError("copying SWA rows needs a source and a page of the request's")
            pairs.append((self.swa, own, swa))
        for pool, dst, src in pairs:
            if pool.tensors is None:
                continue
            d, s = dst * P, src * P
            for store in (pool.tensors.k, pool.tensors.v):
                for t in store:
                    t[d:d + n].copy_(t[s:s + n])

    # ---- addressing ---------------------------------------------------------------------
    def full_slots(self, seq: SeqKV, start: int, end: int) -> torch.Tensor:
        from .slot_map import page_slots
        return page_slots(seq.full_pages, start, end, self.page_size)

    def swa_slots(self, seq: SeqKV, start: int, end: int) -> torch.Tensor:
        """SWA slots of positions [start, end); every one must still be live."""
        if not self.hybrid:
            return self.full_slots(seq, start, end)
        from .slot_map import page_slots
        return page_slots(seq.swa_pages, start, end, self.page_size, "SWA KV")

    # ---- accounting ---------------------------------------------------------------------
    def check_integrity(self) -> None:
        self.full.check_integrity()
        self.swa.check_integrity()
        if self._map is not None:
            held = self.swa.allocator.num_in_use + self.swa.allocator.num_evictable
            if self.has_owner:      # a cached SWA page may be mapped from two full pages
                assert self._map.distinct_targets() <= held * self.page_size, \
                    "full->SWA map points at SWA slots no one holds"
            else:
                assert self._map.mapped_slots() == self.swa.allocator.num_in_use * self.page_size, \
                    "full->SWA map disagrees with the SWA pool's pages in use"

    @property
    def num_live_seqs(self) -> int:
        return len(self._seqs)

    def stats(self) -> dict[str, dict[str, int]]:
        return {"full": self.full.allocator.stats(), "swa": self.swa.allocator.stats()}
