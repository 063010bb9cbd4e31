"""The page accounting between the prefix cache's locks and the scheduler's reservations,
each case one that broke before (no model: the scheduler and the cache alone)."""
import random

from helpers.sched_harness import Harness

from mimo.engine.prefill_planner import ChunkedPrefill


class SlowFor(ChunkedPrefill):
    """Prefill chunks of at most `n` tokens for the requests in `slow`."""
    def __init__(self, n):
        self.n, self.slow = n, set()

    def plan(self, seq, remaining, budget, room):
        k = super().plan(seq, remaining, budget, room)
        return min(k, self.n) if seq.id in self.slow else k


def _tokens(n, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(3, 100) for _ in range(n)]


def _arrives_when(h, x, computed, prompt, max_tokens):
    """Add `prompt` once `x` has computed `computed` tokens. A request that shares a prefix
    with one still prefilling it waits while a whole page of it is left to compute (the
    scheduler's in-flight rule), so an overlap needs an arrival within the last page."""
    h.run(until=lambda: x.num_computed >= computed)
    assert x.num_computed == computed
    return h.add(prompt, max_tokens=max_tokens)


def _recording_adopt(h):
    adopted = []
    adopt = h.pool.adopt
    h.pool.adopt = lambda seq, full, swa: (adopted.append((dict(full), dict(swa))),
                                           adopt(seq, full, swa))
    return adopted


def test_sync_after_another_request_cached_further_locks_a_window_safe_node():
    """X prefills slowly; Y, sharing X's prompt and going further, arrives with less than a
    page of it left for X, so both compute that page in one step and Y caches on past it
    (windows only at its own checkpoints). Each sync then matches the other's path, where a
    window may never have been kept: a rebuild match, whose window cannot be locked. Sync
    locks a plain window-safe node instead, and the later one adopts the earlier one's copy
    of the page both computed. (Before the in-flight rule Y arrived long before X was done
    and this raised "locking a window that is not live".)"""
    slow = SlowFor(1)
    h = Harness(prefill=slow, chunk=40)
    adopted = _recording_adopt(h)
    T = _tokens(64)
    x = h.add(T[:48] + [5, 6], max_tokens=4)
    slow.slow.add(x.id)
    y = _arrives_when(h, x, 47, T, 3)       # Y recomputes from X's last page on
    h.step()
    assert x.in_prefill and not y.in_prefill
    h.run()
    assert x.finish_reason == "length"
    assert adopted and any(full for full, _ in adopted)
    h.check()
    assert h.pool.full.allocator.num_in_use == 0


def test_a_request_that_recomputed_cached_tokens_pins_only_pages_in_its_table():
    """Y recomputes a page X cached in the same step. When Y's lock moves onto X's nodes, Y
    adopts X's pages (freeing its duplicates), so the lock pins only pages in Y's own table,
    none that admission had counted as evictable (the harness checks the rule after every
    step)."""
    slow = SlowFor(1)
    h = Harness(prefill=slow, chunk=40, rebuild=False)
    adopted = _recording_adopt(h)
    T = _tokens(60, seed=1)
    x = h.add(T[:56] + [7], max_tokens=3)
    slow.slow.add(x.id)
    y = _arrives_when(h, x, 55, T, 3)
    h.run()
    assert x.finish_reason == "length" and y.finish_reason == "length"
    assert adopted and any(full for full, _ in adopted)
    assert h.pool.full.allocator.num_in_use == 0


def test_decoding_past_the_locked_window_lets_go_of_it():
    """Decoding moves the request's own window on, past the window before its lock's node
    (its prompt's end). The lock lets go of those pages as window release drops them from
    the table: they stay cached but evictable, the request's SWA need is its steady window
    again (nothing pinned outside its table), and its full lock stays."""
    from mimo.kvcache.pool.allocator import EVICTABLE, IN_USE
    from mimo.kvcache.pool.layout import swa_steady_pages
    h = Harness(window=6, page=2, chunk=64)
    seq = h.add(_tokens(30, seed=2), max_tokens=20)
    h.step()                                        # the whole prompt: cached, locked
    node = seq.kv.node
    window = [p for _, p in h.cache.tree.window_of(node)]
    sa, fa = h.pool.swa.allocator, h.pool.full.allocator
    assert len(window) == 3 and all(sa._state[p] == IN_USE for p in window)
    h.run(until=lambda: len(seq.output_ids) >= 12)
    assert seq.kv.node is node
    assert all(sa._state[p] == EVICTABLE for p in window)
    assert all(fa._state[p] == IN_USE for p in seq.kv.full_pages)
    assert h.cache.pinned_outside(seq.kv) == (0, 0)
    steady = swa_steady_pages(h.pool.window, h.pool.page_size, seq.max_len)
    assert h.sched.need(seq)[1] == steady + len(seq.kv.keep_swa)
    h.run()
    h.check_idle()


def test_a_failed_admission_keeps_the_rebuildable_prefix_it_matched():
    """A request whose cached prefix needs a window rebuild waits once for room: handing
    the match back must not trim the leaf it would rebuild from."""
    h = Harness(window=6, page=2, full_pages=60, swa_pages=60, chunk=64)
    T = _tokens(40, seed=3)
    h.add(T, max_tokens=1)
    h.run()
    # SWA pressure: the cached windows go, the full KV stays (a rebuild reaches it).
    h.cache.tree.evict(0, h.pool.swa.allocator.num_evictable)
    want = h.cache.cached_len(T + [9, 9])
    assert want > 0                          # reusable by a rebuild
    blocker = h.add(_tokens(20, seed=4), max_tokens=60)   # reserves most of the full pool
    h.step()
    b = h.add(T + [9, 9], max_tokens=10)
    h.step()                                 # no room for b yet: its match is handed back
    assert b.kv is None and blocker.kv is not None
    h.run()
    assert b.cached_tokens == want           # 0 before: the leaf had been trimmed
