"""The scheduler on its own: real DualPool and prefix-cache bookkeeping, no model and no
torch (sched_harness.py). Batching order and token budgets, admission and preemption,
prefix reuse, length buckets, drafts and their rollback, and the prefill planner's bound.
Whatever the schedule, a request's tokens are the same: they are a fixed function of the
sequence so far, so a schedule that loses, repeats or misplaces work shows as a difference."""
from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.sched_harness import Harness, continuation

from mimo.engine.prefill_planner import ChunkedPrefill

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _tokens(n, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(3, 100) for _ in range(n)]


def _prompts(seed=0, lengths=(40, 70, 33, 90, 52, 61)):
    return [_tokens(n, seed + i) for i, n in enumerate(lengths)]


def _drain(h: Harness, prompts, max_tokens=20):
    seqs = [h.add(p, max_tokens) for p in prompts]
    most, waited = 0, False
    for _ in range(20_000):
        if not h.sched.has_work():
            break
        h.step()
        most = max(most, len(h.sched.running))
        waited |= bool(h.sched.waiting) and bool(h.sched.running)
    else:
        pytest.fail("the scheduler did not drain")
    h.check_idle()
    return seqs, most, waited


def _expected(prompts, max_tokens=20):
    return [continuation(p, max_tokens) for p in prompts]


def test_the_scheduler_and_its_bookkeeping_import_no_torch():
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "import mimo.engine.scheduler\n"
            "from helpers.sched_harness import Harness\n"
            "h = Harness(); [h.add(list(range(3, 3 + n)), 4) for n in (9, 30)]; h.run()\n"
            "h.check_idle()\n"
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', "
            "'mimo.models', 'mimo.gpu'))]\n"
            "assert not bad, bad\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code, str(HERE.parent)], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr


def test_decodes_go_first_and_prefill_chunks_take_the_budget():
    """A decode's own token rides on top of the budget: b's chunks are whole budgets."""
    h = Harness(chunk=32)
    a = h.add(_tokens(10), max_tokens=8)
    first = h.step()
    assert [(c.seq, c.start, c.n, c.sample) for c in first] == [(a, 0, 10, True)]
    b = h.add(_tokens(100, 1), max_tokens=2)
    sizes = []
    while b.in_prefill:
        chunks = h.step()
        if any(c.seq is a for c in chunks):
            assert chunks[0].seq is a and chunks[0].n == 1      # a's token before b's chunk
        for c in chunks:
            if c.seq is b:
                sizes.append(c.n)
                assert c.start + c.n <= len(b.prompt_ids)
                assert c.sample == (c.start + c.n == len(b.prompt_ids))
    assert sizes == [32, 32, 32, 4]     # beside a's decodes, which take none of the budget
    h.run()
    assert a.output_ids == continuation(a.prompt_ids, 8)
    assert b.output_ids == continuation(b.prompt_ids, 2)


def test_a_step_with_nobody_decoding_takes_the_whole_budget():
    """The mixed budget holds while any request decodes; a step where all prefill takes
    `max_num_batched_tokens` (nobody's next token waits for it)."""
    h = Harness(chunk=64, mixed=16)
    a = h.add(_tokens(100), max_tokens=3)
    assert [c.n for c in h.step()] == [64]
    assert [c.n for c in h.step()] == [36]          # a's last chunk; a decodes from now
    b = h.add(_tokens(150, 1), max_tokens=2)
    sizes = []
    while b.in_prefill:
        chunks = h.step()
        decoding = [c for c in chunks if c.seq is a]
        sizes += [(c.n, bool(decoding)) for c in chunks if c.seq is b]
    # 16 while a decodes (its 2 more tokens), then 64 at a time once a has finished.
    assert sizes == [(16, True), (16, True), (64, False), (54, False)]
    h.run()
    assert a.output_ids == continuation(a.prompt_ids, 3)
    assert b.output_ids == continuation(b.prompt_ids, 2)


@pytest.mark.parametrize("seed", range(6))
def test_a_chunk_past_the_mixed_budget_takes_only_free_swa_pages(seed):
    """The SWA pool reserves one mixed-budget chunk's transient pages, not a whole budget's:
    a tight pool still admits as before, and larger chunks fit in what is free. Nothing
    runs out of pages (an OutOfPages under 'reserve' raises here), tokens are unchanged."""
    rng = random.Random(seed)
    prompts = [_tokens(rng.randrange(20, 120), seed * 10 + i) for i in range(8)]
    h = Harness(chunk=96, mixed=8, swa_pages=12 + seed, page=2, window=6)
    seqs = [h.add(p, rng.randrange(1, 12)) for p in prompts]
    big = 0
    while h.sched.has_work():
        big = max([big] + [c.n for c in h.step() if c.start < c.seq.prefill_end])
    h.check_idle()
    assert big > 8                                  # some chunk went past the mixed budget
    assert [s.output_ids for s in seqs] == [continuation(p, s.params.max_tokens)
                                            for p, s in zip(prompts, seqs)]


@pytest.mark.parametrize("chunk", [7, 16, 64])
@pytest.mark.parametrize("cache", [True, False])
def test_chunk_size_and_the_cache_do_not_change_tokens(chunk, cache):
    prompts = _prompts(1)
    seqs, _, _ = _drain(Harness(chunk=chunk, cache=cache), prompts)
    assert [s.output_ids for s in seqs] == _expected(prompts)


@pytest.mark.parametrize("which", ["full", "swa"])
def test_requests_wait_for_a_full_pool_then_run(which):
    """Reserve admission: one pool too small for all six at once; they queue, nothing runs
    out of pages, and the tokens are those of a roomy pool."""
    prompts = _prompts(2)
    pools = dict(full_pages=70, swa_pages=80) if which == "full" else dict(swa_pages=14)
    seqs, most, waited = _drain(Harness(chunk=16, **pools), prompts)
    assert waited and 1 <= most < 6
    assert [s.output_ids for s in seqs] == _expected(prompts)
    assert all(s.preemptions == 0 for s in seqs)


def test_optimistic_admission_preempts_and_resumes_with_identical_tokens():
    prompts = _prompts(3)
    kw = dict(chunk=16, full_pages=100, swa_pages=80)   # the largest request alone: 75 pages
    work = {}
    for cache in (True, False):
        h = Harness(admission="optimistic", cache=cache, **kw)
        seqs, most, _ = _drain(h, prompts, max_tokens=60)
        assert sum(s.preemptions for s in seqs) > 0
        assert [s.output_ids for s in seqs] == _expected(prompts, 60)
        work[cache] = h.prefill_tokens
    assert work[True] < work[False]     # a resumed request re-prefills from the cache
    again, most_r, _ = _drain(Harness(admission="reserve", **kw), prompts, max_tokens=60)
    assert all(s.preemptions == 0 for s in again) and most_r < most
    assert [s.output_ids for s in again] == _expected(prompts, 60)


def test_max_num_seqs_bounds_the_running_set():
    prompts = _prompts(4, (12,) * 6)
    seqs, most, waited = _drain(Harness(max_num_seqs=2), prompts, max_tokens=5)
    assert most == 2 and waited
    assert [s.output_ids for s in seqs] == _expected(prompts, 5)


def test_a_request_that_can_never_fit_is_not_admissible():
    h = Harness(full_pages=20)
    ok, too_big = h.add(_tokens(30), 5), None
    assert h.sched.fits_empty_pool(ok)
    from mimo.engine.sampling_params import SamplingParams
    from mimo.engine.sequence import Sequence
    too_big = Sequence(99, _tokens(41), SamplingParams(max_tokens=1), frozenset())
    assert h.sched.need(too_big, worst=True)[0] == 21 and not h.sched.fits_empty_pool(too_big)


def test_a_repeated_prompt_skips_its_cached_prefix():
    h = Harness(page=2, chunk=64)
    p = _tokens(40, 5)
    first = h.add(p, 3)
    h.run()
    assert first.cached_tokens == 0
    again = h.add(p + [9, 9, 9], 3)
    chunks = h.step()
    assert again.cached_tokens > 0 and again.cached_tokens % 2 == 0
    assert chunks[0].start == again.cached_tokens
    h.run()
    assert again.output_ids == continuation(again.prompt_ids, 3)
    h.check_idle()
    off = Harness(page=2, chunk=64, cache=False)
    off.add(p, 3)
    off.run()
    assert off.add(p, 3).cached_tokens == 0


@pytest.mark.parametrize("policy, order", [("fcfs", ["long", "short", "mid"]),
                                           ("compute-aware", ["short", "mid", "long"])])
def test_the_waiting_policy_decides_who_goes_first(policy, order):
    h = Harness(max_num_seqs=1, policy=policy, full_pages=400, swa_pages=200)
    seqs = {"long": h.add([7] * 300, 3), "short": h.add([9] * 8, 3), "mid": h.add([11] * 60, 3)}
    done = []
    while h.sched.has_work():
        h.step()
        done += [k for k, s in seqs.items() if s.finish_reason and k not in done]
    assert done == order


def test_length_buckets_keep_prefills_apart():
    h = Harness(policy="fcfs", length_buckets=(64,), chunk=256, full_pages=400, swa_pages=200)
    for n in (300, 8, 200, 9):
        h.add(_tokens(n, n), 3)
    seen = set()
    while h.sched.has_work():
        chunks = h.step()
        prefill = {len(c.seq.prompt_ids) >= 64 for c in chunks
                   if c.start < len(c.seq.prompt_ids)}
        assert len(prefill) <= 1, "short and long prompts shared a prefill batch"
        seen |= prefill
    assert seen == {True, False}


def _pages_match_computed(h):
    P = h.pool.page_size
    for s in h.sched.running:
        assert len(s.kv.full_pages) == math.ceil(s.num_computed / P), \
            f"request {s.id}: pages beyond its computed tokens (rollback missed)"


def _budget_used(chunks) -> int:
    """Tokens a step charges to its budget: drafts and prefill chunks share it; each
    decode's own token is extra."""
    return sum(len(c.draft) if c.draft else c.n if c.start < len(c.seq.prompt_ids) else 0
               for c in chunks)


@pytest.mark.parametrize("quality", ["right", "wrong", "half"])
def test_drafts_are_verified_and_rejected_ones_rolled_back(quality):
    rng = random.Random(7)

    def drafter(seq, k):
        right = continuation(seq.all_ids, k)
        if quality == "right":
            return right
        if quality == "wrong":
            return [t + 1 for t in right]
        return [t if rng.random() < 0.5 else t + 1 for t in right]
    prompts = _prompts(6, (20, 35, 9))
    h = Harness(num_draft=3, drafter=drafter, chunk=24)
    seqs = [h.add(p, 17) for p in prompts]
    steps = 0
    while h.sched.has_work():
        chunks = h.step()
        steps += 1
        for c in chunks:
            assert len(c.draft) <= 3 and c.n == 1 + len(c.draft) or not c.draft
        assert _budget_used(chunks) <= 24
        _pages_match_computed(h)
    h.check_idle()
    assert [s.output_ids for s in seqs] == _expected(prompts, 17)    # never past max_tokens
    plain = Harness(chunk=24)
    [plain.add(p, 17) for p in prompts]
    plain_steps = 0
    while plain.sched.has_work():
        plain.step()
        plain_steps += 1
    if quality == "right":
        assert steps < plain_steps
    elif quality == "wrong":
        assert steps == plain_steps


def test_a_planner_that_plans_past_its_bound_is_refused_and_fails_only_its_request():
    class Greedy(ChunkedPrefill):
        def plan(self, seq, remaining, budget, room):
            if seq.id == 1:
                return remaining + 1
            return super().plan(seq, remaining, budget, room)
    h = Harness(prefill=Greedy(), chunk=64)
    good = h.add(_tokens(10), 2)
    h.step()
    bad = h.add(_tokens(12, 1), 2)
    with pytest.raises(ValueError, match="prefill step planned 13 tokens"):
        h.sched.schedule(None)
    assert h.sched.touched == [bad]
    h.sched.fail(bad)
    h.run()
    assert good.output_ids == continuation(good.prompt_ids, 2)
    h.check_idle()


def test_finish_frees_a_running_request_and_unqueues_a_waiting_one():
    h = Harness(max_num_seqs=1)
    running, waiting = h.add(_tokens(20), 50), h.add(_tokens(20, 1), 50)
    h.step()
    assert running.kv is not None and waiting in h.sched.waiting
    live = h.pool.num_live_seqs
    h.sched.finish(waiting)
    assert waiting not in h.sched.waiting and h.pool.num_live_seqs == live
    h.sched.finish(running)
    assert running.kv is None and not h.sched.has_work()
    h.check()
    h.check_idle()


def test_the_full_kv_layout_schedules_the_same_tokens():
    prompts = _prompts(8)
    seqs, _, _ = _drain(Harness(hybrid=False, chunk=16), prompts)
    assert [s.output_ids for s in seqs] == _expected(prompts)


def test_a_request_sharing_a_prefix_in_flight_waits_for_it_and_reuses_it():
    # Page 8, window 16: the first request's prompt ends 5 tokens past the 96 shared ones, so
    # the window before the shared end is still held when the second is admitted.
    h = Harness(window=16, page=8, chunk=128, full_pages=400, swa_pages=200)
    common = _tokens(96, 3)
    first = h.add(common + _tokens(5, 4), 3)
    second = h.add(common + _tokens(9, 5), 3)
    other = h.add(_tokens(20, 6), 3)        # shares nothing
    h.step()
    assert h.sched.running == [first, other]    # the second passed over, not blocking
    h.step()
    assert second in h.sched.running and second.cached_tokens == 96
    h.run()
    assert h.prefill_tokens == 101 + 9 + 20     # the shared pages computed once
    for s in (first, second, other):
        assert s.output_ids == continuation(s.prompt_ids, 3)
    h.check_idle()


def test_a_request_is_held_only_while_a_page_of_its_prefix_is_still_to_compute():
    h = Harness(window=16, page=8, chunk=128, full_pages=400, swa_pages=200)
    a = h.add(_tokens(5, 1) + _tokens(40, 2), 2)
    b = h.add(_tokens(5, 1) + _tokens(40, 3), 2)    # 5 shared tokens: under a page
    h.step()
    assert h.sched.running == [a, b]
    h.run()
    h = Harness(window=16, page=8, chunk=16, full_pages=400, swa_pages=200)
    long = _tokens(40, 7)
    c = h.add(long + [5], 2)
    h.step()
    d = h.add(long + [6, 6], 2)             # shares 40 tokens, 16 of them computed
    while d not in h.sched.running:
        computed = c.num_computed
        h.step()
        assert (d in h.sched.running) == (computed >= 40)
    h.run()
    assert d.cached_tokens == 40
    for s in (c, d):
        assert s.output_ids == continuation(s.prompt_ids, 2)
    h.check_idle()
