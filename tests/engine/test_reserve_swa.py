"""Admission 'reserve' promises that a running request never runs out of pages. Its SWA
reservation is the steady window (ceil(W / P) + 1 pages, plus its retention pages); the
prefix cache's lock on the window before the request's cached prefix must never make it
hold more once decoding has moved past that window. Both cases ran out of SWA pages
before the fix (no model: the scheduler and the cache alone)."""
import random

from helpers.sched_harness import Harness


def _tokens(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(3, 100) for _ in range(n)]


def _steady(h):
    """The steady SWA window in pages, by plain arithmetic: W tokens, plus one page for a
    window that does not start on a page boundary."""
    return -(-h.pool.window // h.pool.page_size) + 1


def _run_checking_swa(h, seqs):
    """Run to the end; after every step with no prefill, the SWA pages in use (tables and
    the cache's locked pages) are within the running requests' steady reservations."""
    while h.sched.has_work():
        h.step()
        running = h.sched.running
        if running and not any(s.in_prefill for s in running):
            bound = sum(_steady(h) + len(s.kv.keep_swa) for s in running)
            assert h.pool.swa.allocator.num_in_use <= bound
    for s in seqs:
        assert s.finish_reason == "length" and len(s.output_ids) == s.params.max_tokens
    h.check_idle()


def test_one_request_decoding_past_its_cached_window_keeps_to_its_reservation():
    """Window 16, page 4, an 8-page SWA pool: the request reserves 5 pages plus a 2-page
    prefill transient. Its prompt is cached as it is prefilled and its lock moves onto the
    prompt's window; decoding then moves its own window past that one. With nothing else
    to preempt, the 4 pinned pages plus its live window overflowed the pool."""
    h = Harness(window=16, page=4, full_pages=100, swa_pages=8, chunk=4)
    seq = h.add(_tokens(20, seed=1), max_tokens=24)
    h.step()
    assert seq in h.sched.running
    _run_checking_swa(h, [seq])


def test_two_requests_decoding_past_their_cached_windows_keep_to_their_reservations():
    """Window 16, page 4, a 13-page SWA pool: two requests reserve 5 pages each (plus a
    3-page prefill transient shared by all) and run together; with their prompts' windows
    pinned behind them they came to hold 8 and 7."""
    h = Harness(window=16, page=4, full_pages=200, swa_pages=13, chunk=8, rebuild=False)
    a = h.add(_tokens(30, seed=2), max_tokens=25)
    b = h.add(_tokens(18, seed=3), max_tokens=26)
    h.run(until=lambda: len(h.sched.running) == 2)
    assert [h.sched.need(s)[1] for s in (a, b)] == [_steady(h), _steady(h)]
    _run_checking_swa(h, [a, b])
