"""StorageTier: the L3 backend driven from its own I/O thread, never from the engine's.

The engine thread hands over work and never waits on storage:
- writes (`write`): page rows snapshotted from L1, serialized and stored off-thread through
  a bounded queue; a full queue drops the batch and counts it;
- lookups (`fetch`): a concurrent Future resolved with the payloads a request's hit needs;
  the engine polls it between steps while the request waits outside the running batch;
- keep-alive touches (`touch`), fire and forget.
Every storage call has the tier's deadline; a backend answers misses rather than raising
(mimo/kvcache/tiers/storage.py), and anything that still raises here is counted and
treated as a miss. Stats are plain integers written by the I/O thread, read for /metrics.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .hit_plan import best_hit, window_of
from .keys import FULL, SWA, KeyChain
from .page_io import PageIO

if TYPE_CHECKING:
    import torch

    from .storage import KVStorage, Payload

log = logging.getLogger("mimo.kvcache.tiers")

# Load-latency histogram bucket bounds (seconds), for /metrics.
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass
class FetchPlan:
    """What a waiting request could use from L3: its page keys and which pages the tiers
    above already hold (a snapshot taken on the engine thread)."""
    keys: list[bytes]
    local_full: list[bool]
    local_swa: list[bool] | None      # None: no SWA pool
    floor: int                        # pages the tiers above already serve


@dataclass
class FetchResult:
    pages: int = 0                    # the hit the payloads complete (0: nothing useful)
    payloads: dict[tuple[str, bytes], Payload] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class WriteStats:
    batches: int = 0
    pages: int = 0
    dropped: int = 0          # pages whose write was dropped (queue full, backend refused)
    failed: int = 0           # pages the backend did not store
    fetches: int = 0
    fetch_timeouts: int = 0
    fetch_errors: int = 0
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    latency_sum: float = 0.0


class StorageTier:
    def __init__(self, storage: KVStorage, keys: KeyChain, io: dict[str, PageIO], window: int,
                 timeout: float, queue_size: int):
        self.storage, self.keys, self.io = storage, keys, io
        self.W, self.P = window, keys.P
        self.timeout, self.queue_size = timeout, queue_size
        self.stats = WriteStats()
        self._pending = 0
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mimo-kv-storage",
                                        daemon=True)
        self._thread.start()
        self._closed = False
        # Keys the engine learns were not stored after all (write failed): read back on the
        # engine thread (`failed_keys`), which forgets them as written.
        self._failed: list[str] = []
        # Told (names, present) on the I/O thread: names stored or found, names found
        # missing (the router's publishing learns the shared store's contents from them).
        self.on_seen: Callable[[list[str], bool], None] | None = None

    # ---- engine thread ------------------------------------------------------------------
    def write(self, names: list[str], rows: torch.Tensor, done: Callable[[], object] | None = None) -> bool:
        """Store rows[i] under names[i] off-thread. False: the queue was full and the batch
        was dropped (counted)."""
        with self._lock:
            if self._closed or self._pending >= self.queue_size:
                self.stats.dropped += len(names)
                return False
            self._pending += 1
            self._idle.clear()
        asyncio.run_coroutine_threadsafe(self._put(names, rows), self._loop)
        return True

    def fetch(self, plan: FetchPlan) -> concurrent.futures.Future[FetchResult]:
        return asyncio.run_coroutine_threadsafe(self._fetch(plan), self._loop)

    def touch(self, names: list[str]) -> None:
        """Refresh these entries' age in storage (keep-alive); queued like a write, and
        dropped silently when the queue is full (the next hit touches again)."""
        with self._lock:
            if not names or self._closed or self._pending >= self.queue_size:
                return
            self._pending += 1
            self._idle.clear()
        asyncio.run_coroutine_threadsafe(self._touch(names), self._loop)

    def _done(self) -> None:
        self._pending -= 1
        if self._pending == 0:
            self._idle.set()

    def failed_keys(self) -> list[str]:
        with self._lock:
            out, self._failed = self._failed, []
        return out

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued write and touch was attempted; True if the queue
        emptied."""
        return self._idle.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        fut = asyncio.run_coroutine_threadsafe(self.storage.aclose(), self._loop)
        try:
            fut.result(timeout=5)
        except Exception as e:  # noqa: BLE001 - closing: nothing left to protect
            log.warning("closing KV storage: %r", e)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    # ---- I/O thread ---------------------------------------------------------------------
    async def _put(self, names: list[str], rows: torch.Tensor) -> None:
        try:
            payloads = PageIO.row_bytes_of(rows)
            ok = await self.storage.put(list(zip(names, payloads)), self.timeout)
            bad = [n for n, good in zip(names, ok) if not good]
        except Exception as e:  # noqa: BLE001 - a failed write is a dropped write
            log.warning("KV storage write failed: %r", e)
            bad = list(names)
        if self.on_seen is not None and len(bad) < len(names):
            failed = set(bad)
            self._seen([n for n in names if n not in failed], True)
        with self._lock:
            self.stats.batches += 1
            self.stats.pages += len(names) - len(bad)
            self.stats.failed += len(bad)
            self._failed.extend(bad)
            self._done()

    async def _touch(self, names: list[str]) -> None:
        try:
            await self.storage.touch(names, self.timeout)
        except Exception as e:  # noqa: BLE001 - keep-alive is best effort
            log.debug("KV storage touch failed: %r", e)
        with self._lock:
            self._done()

    async def _fetch(self, plan: FetchPlan) -> FetchResult:
        t0 = time.perf_counter()
        self.stats.fetches += 1
        try:
            res = await asyncio.wait_for(self._lookup(plan), self.timeout)
        except asyncio.TimeoutError:
            self.stats.fetch_timeouts += 1
            res = FetchResult()
        except Exception as e:  # noqa: BLE001 - a failed lookup is a miss
            log.warning("KV storage lookup failed: %r", e)
            self.stats.fetch_errors += 1
            res = FetchResult()
        res.seconds = time.perf_counter() - t0
        b = next((i for i, ub in enumerate(LATENCY_BUCKETS) if res.seconds <= ub),
                 len(LATENCY_BUCKETS))
        self.stats.latency_counts[b] += 1
        self.stats.latency_sum += res.seconds
        return res

    async def _lookup(self, plan: FetchPlan) -> FetchResult:
        """The payloads that lengthen the plan's hit the most, in one round trip when the
        longest hit is there: the first one reads every missing full page and the SWA window
        before the last page (what a repeated prompt needs) and only probes the other SWA
        pages; a shorter hit reads its own window in a second one. A full page read beyond a
        shorter hit is wasted, but it is the rare case (a window evicted while its full KV
        stayed)."""
        keys, n_all, name = plan.keys, len(plan.keys), self.keys.name
        swa_local = plan.local_swa
        ask_f = [i for i in range(n_all) if not plan.local_full[i]]
        ask_s: list[int] = []
        probe_s: list[int] = []
        if swa_local is not None:
            optimistic = set(window_of(n_all, self.W, self.P))
            for i in range(n_all):
                if not swa_local[i]:
                    (ask_s if i in optimistic else probe_s).append(i)
        if not ask_f and not ask_s and not probe_s:
            return FetchResult()
        want = [(FULL, i) for i in ask_f] + [(SWA, i) for i in ask_s]
        blobs, found = await self.storage.get_and_probe(
            [name(k, keys[i]) for k, i in want], [name(SWA, keys[i]) for i in probe_s],
            self.timeout)
        got: dict[tuple[str, int], Payload] = {}
        self._keep(want, blobs, got)
        have_s = {i for i, ok in zip(probe_s, found) if ok}
        if self.on_seen is not None:
            self._seen([name(SWA, keys[i]) for i in have_s]
                       + [name(k, keys[i]) for k, i in want if (k, i) in got], True)
            self._seen([name(SWA, keys[i]) for i in probe_s if i not in have_s]
                       + [name(k, keys[i]) for k, i in want if (k, i) not in got], False)
        for _ in range(2):      # again if entries vanished between the probe and the read
            full_ok = [plan.local_full[i] or (FULL, i) in got for i in range(n_all)]
            swa_ok = (None if swa_local is None else
                      [swa_local[i] or (SWA, i) in got or i in have_s for i in range(n_all)])
            n = best_hit(full_ok, swa_ok, self.W, self.P, plan.floor)
            if n <= plan.floor:
                return FetchResult()
            win: set[int] = set()
            need: list[tuple[str, int]] = []
            if swa_local is not None:
                win = set(window_of(n, self.W, self.P))
                need = [(SWA, i) for i in sorted(win)
                        if not swa_local[i] and (SWA, i) not in got]
            if not need:
                return FetchResult(n, {(k, keys[i]): b for (k, i), b in got.items()
                                       if (i < n if k == FULL else i in win)})
            blobs = await self.storage.get([name(k, keys[i]) for k, i in need], self.timeout)
            self._keep(need, blobs, got)
            self._seen([name(k, keys[i]) for k, i in need if (k, i) not in got], False)
            have_s -= {i for (_, i) in need if (SWA, i) not in got}
        return FetchResult()

    def _seen(self, names: list[str], present: bool) -> None:
        if names and self.on_seen is not None:
            try:
                self.on_seen(names, present)
            except Exception:  # noqa: BLE001 - publishing must never fail a load
                log.exception("KV storage: reporting seen entries failed")

    def _keep(self, want: list[tuple[str, int]], blobs: list[Payload | None],
              got: dict[tuple[str, int], Payload]) -> None:
        for w, blob in zip(want, blobs):
            if blob is not None and len(blob) == self.io[w[0]].row_bytes:
                got[w] = blob
