"""Waiting-queue policies: ordering, aging's wait bound (fake clock, thousands of arrivals),
head-of-line blocking, length buckets, removal, the factory. No engine, no sleeps."""
import bisect
import math
import random

import pytest

from mimo.engine.policy import FCFS, ComputeAware, LengthBuckets, make_policy


class S:
    """A fake waiting request: what the policies read from a Sequence."""
    def __init__(self, n, cached=0, arrival=0.0, need=0):
        self.prompt_ids = range(int(n))     # len() is all a policy needs
        self.cached_tokens, self.arrival, self.need = cached, arrival, need

    def __repr__(self):
        return f"S({len(self.prompt_ids)}, {self.cached_tokens}, {self.arrival})"


def u(s):
    return len(s.prompt_ids) - s.cached_tokens


def wait_bound(policy: ComputeAware, s, drain_s: float = 0.0) -> float:
    """ComputeAware's bound on a request's wait (its class docstring): u/a + drain_s, with u
    the request's uncached tokens as the policy counts them (clamped to max_uncached)."""
    return policy.uncached_tokens(s) / policy.aging + drain_s


def test_fcfs_order_removal_and_requeue():
    p, seqs = FCFS(), [S(n) for n in (500, 10, 90, 7)]
    for i, s in enumerate(seqs):
        p.push(s, now=float(i))
    assert list(p.candidates(10.0)) == seqs and len(p) == 4 and seqs[2] in p
    p.remove(seqs[1])
    assert list(p) == [seqs[0], seqs[2], seqs[3]]
    with pytest.raises(KeyError):
        p.remove(seqs[1])
    with pytest.raises(ValueError):
        p.push(seqs[0], now=11.0)
    assert p.pop(seqs[0]) is seqs[0]
    p.push(seqs[0], now=12.0, since=0.0)        # preempted: keeps its place by age
    assert list(p) == [seqs[0], seqs[2], seqs[3]]
    assert not p.may_skip(seqs[0], 1e9) and p.waited(seqs[0], 12.0) == 12.0


def test_compute_aware_orders_by_uncached_then_ages():
    p = ComputeAware(aging_per_second=10.0)
    big, mid, hit, small = S(1000), S(300), S(1000, cached=950), S(100)
    for s in (big, mid, hit, small):
        p.push(s, now=0.0)
    assert list(p.candidates(0.0)) == [hit, small, mid, big]   # uncached 50, 100, 300, 1000
    assert p.priority(big, 20.0) == 800.0 and p.deadline(big) == 100.0
    late = S(200)
    p.push(late, now=50.0)                     # big: 1000-10*50 = 500 > late's 200
    assert list(p) == [hit, small, mid, late, big]
    later = S(200)
    p.push(later, now=81.0)                    # big at 81: 190 < 200: big goes first
    assert list(p)[-2:] == [big, later]
    assert p.may_skip(big, 99.9) and not p.may_skip(big, 100.0)
    assert wait_bound(p, big, drain_s=3.0) == 103.0


def test_compute_aware_custom_uncached_clamp_and_safe_iteration():
    known = {}
    p = ComputeAware(aging_per_second=1.0, uncached=lambda s: known.get(s, 10**6), max_uncached=500)
    a, b, c = S(1), S(1), S(1)
    known.update({a: 400, b: 10**6, c: 20})
    for s in (a, b, c):
        p.push(s, now=0.0)
    assert list(p) == [c, a, b] and wait_bound(p, b) == 500.0   # b clamped to 500
    seen = []
    for s in p.candidates(1.0):                # the scheduler pops and pushes while walking
        seen.append(s)
        p.pop(s)
        if s is c:
            p.push(S(1), now=1.0)
    assert seen == [c, a, b] and len(p) == 1


def test_many_pushes_and_removes_stay_ordered():
    rng, p, live = random.Random(0), ComputeAware(aging_per_second=5.0), []
    for i in range(5000):
        s = S(rng.randint(1, 4000))
        p.push(s, now=i * 0.01)
        live.append(s)
        if rng.random() < 0.6:
            k = rng.randrange(len(live))
            live[k], live[-1] = live[-1], live[k]
            p.remove(live.pop())
    order = list(p)
    assert set(order) == set(live) and len(p) == len(live) and len(p._heap) <= 2 * len(live) + 33
    keys = [p.priority(s, 0.0) for s in order]
    assert keys == sorted(keys)


def serve(policy, arrivals, rate):
    """One non-preemptive server computing `rate` uncached tokens/s, fed by the policy."""
    t, i, out = 0.0, 0, {}
    while i < len(arrivals) or len(policy):
        if not len(policy):
            t = max(t, arrivals[i].arrival)
        while i < len(arrivals) and arrivals[i].arrival <= t:
            policy.push(arrivals[i], now=arrivals[i].arrival)
            i += 1
        s = policy.pop(next(policy.candidates(t)))
        out[s] = (t, t + u(s) / rate)
        t = out[s][1]
    return out


def work_at(out, rate):
    """W(T): uncached tokens arrived by T and not yet computed (queued + rest of the running)."""
    arr = sorted((s.arrival, u(s)) for s in out)
    at, acc = [a for a, _ in arr], [0]
    for _, w in arr:
        acc.append(acc[-1] + w)
    runs = sorted((st, fin, u(s)) for s, (st, fin) in out.items())
    fins, done = [f for _, f, _ in runs], [0]
    for _, _, w in runs:
        done.append(done[-1] + w)

    def W(T):
        k = bisect.bisect_right(fins, T)
        partial = (T - runs[k][0]) * rate if k < len(runs) and runs[k][0] <= T else 0.0
        return acc[bisect.bisect_right(at, T)] - done[k] - partial
    return W


def check_bound(policy, out, rate):
    """wait(s) <= u/a + drain(T), T = arrival + u/a, drain(T) = (W(T) - s's own work)/rate."""
    W, worst = work_at(out, rate), 0.0
    for s, (start, _) in out.items():
        T = s.arrival + wait_bound(policy, s)
        drain = 0.0 if start <= T else (W(T) - u(s)) / rate
        assert start - s.arrival <= wait_bound(policy, s, drain) + 1e-6, s
        worst = max(worst, start - s.arrival)
    return worst


def test_aging_bounds_every_wait_over_thousands_of_arrivals():
    rng, rate, t, arrivals = random.Random(1), 2000.0, 0.0, []
    for _ in range(3000):                      # load ~0.95, uncached 1..4000 tokens
        t += rng.expovariate(0.95)
        arrivals.append(S(rng.randint(1, 4000), arrival=t))
    ca = ComputeAware(aging_per_second=200.0, max_uncached=4000)
    out = serve(ca, arrivals, rate)
    worst = check_bound(ca, out, rate)
    W = work_at(out, rate)
    backlog = max(W(s.arrival) for s in arrivals)
    assert worst <= 4000 / 200.0 + backlog / rate   # the flags-only corollary
    fcfs = serve(FCFS(), arrivals, rate)
    mean = lambda o: sum(st - s.arrival for s, (st, _) in o.items()) / len(o)
    assert mean(out) < mean(fcfs)                  # shortest-first pays off on average
    assert any(out[b][0] < out[a][0] for a, b in zip(arrivals, arrivals[1:]))   # reorders


def test_old_big_request_overtakes_a_stream_of_small_ones():
    arrivals = [S(10_000, arrival=0.0)] + [S(10, arrival=0.004 * i) for i in range(5000)]
    big, rate = arrivals[0], 2000.0            # smalls alone overload the server
    ca = ComputeAware(aging_per_second=1000.0)
    out = serve(ca, arrivals, rate)
    check_bound(ca, out, rate)
    assert out[big][0] < 15.0 < arrivals[-1].arrival      # deadline 10 s + ~2.5 s of backlog
    starved = serve(ComputeAware(aging_per_second=0.0), arrivals, rate)
    assert starved[big][0] > arrivals[-1].arrival          # no aging: behind every small one


def admit(policy, arrivals, capacity=100, dur=1.0, skip=None):
    """Memory-bound admission: each request holds `need` units for `dur` s once admitted.
    skip=None uses policy.may_skip; skip=True always tries past a request that does not fit."""
    running, free, i, t, when = [], capacity, 0, 0.0, {}
    while i < len(arrivals) or len(policy):
        t = min(([arrivals[i].arrival] if i < len(arrivals) else []) + [e for e, _ in running])
        free += sum(n for e, n in running if e <= t)
        running = [(e, n) for e, n in running if e > t]
        while i < len(arrivals) and arrivals[i].arrival <= t:
            policy.push(arrivals[i], now=t)
            i += 1
        for s in policy.candidates(t):
            if s.need <= free:
                policy.pop(s)
                when[s], free = t, free - s.need
                running.append((t + dur, s.need))
            elif not (skip or (skip is None and policy.may_skip(s, t))):
                break
    return when


def test_overdue_request_blocks_smaller_ones_until_it_fits():
    smalls = [S(10, arrival=0.05 * i, need=10) for i in range(600)]      # 20/s, room for 10/s
    big = S(100, arrival=0.01, need=100)
    arrivals = sorted(smalls + [big], key=lambda s: s.arrival)
    ca = ComputeAware(aging_per_second=10.0)
    when = admit(ca, arrivals)
    deadline = big.arrival + wait_bound(ca, big)
    key = lambda s: u(s) + 10.0 * s.arrival
    ahead = sum(1 for s in smalls if key(s) < key(big) and when[s] >= deadline)
    assert deadline < when[big] <= deadline + (math.ceil(ahead / 10) + 1) * 1.0
    assert all(when[s] > when[big] for s in smalls if key(s) > key(big))
    always = admit(ComputeAware(aging_per_second=10.0), arrivals, skip=True)
    assert always[big] > smalls[-1].arrival     # skipping forever: it waits out the stream


def test_length_buckets_assign_and_scale():
    lb = LengthBuckets([0, 100, 1000, math.inf])
    assert [lb.bucket_of(S(n)) for n in (0, 99, 100, 999, 1000, 10**7)] == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError):
        LengthBuckets([1000, 100])


def test_length_buckets_keep_batches_apart_and_serve_every_bucket():
    lb = LengthBuckets([100, 1000])
    shorts, mids, longs = [S(50) for _ in range(100)], [S(500) for _ in range(3)], [S(5e3), S(9e3)]
    for k, s in enumerate(shorts[:50] + mids + longs + shorts[50:]):
        lb.push(s, now=float(k))
    assert lb.next_bucket() == 0 and list(lb)[:50] == shorts[:50]
    batches = []
    while len(lb):                               # the scheduler loop, 4 admissions a batch
        turn = lb.next_bucket()
        batch = [s for _, s in zip(range(4), lb.candidates(0.0, bucket=turn))]
        for s in batch:
            lb.pop(s)
        assert {lb.bucket_of(s) for s in batch} == {turn}
        batches.append(batch)
    assert batches[1] == mids and batches[2] == longs          # round-robin: no starvation
    assert lb.next_bucket() is None and sum(map(len, batches)) == 105


def test_length_buckets_removal_and_inner_policy():
    lb = LengthBuckets([100], inner=lambda: ComputeAware(aging_per_second=1.0))
    a, b, c, d = S(90), S(20), S(5000), S(300, cached=250)
    for s in (a, b, c, d):
        lb.push(s, now=0.0)
    assert list(lb.candidates(0.0)) == [b, a, d, c] and lb.num_buckets == 2
    lb.remove(b)
    assert list(lb) == [a, d, c] and b not in lb and len(lb) == 3
    assert lb.may_skip(c, 4000.0) and not lb.may_skip(c, 5000.0)
    lb.pop(a)                                     # admitted from bucket 0: bucket 1's turn
    assert lb.next_bucket() == 1 and list(lb) == [d, c]


def test_make_policy():
    assert isinstance(make_policy("fcfs"), FCFS)
    p = make_policy("Compute_Aware", aging_per_second=7.0, max_uncached=100)
    assert isinstance(p, ComputeAware) and p.aging == 7.0 and p.max_uncached == 100
    lb = make_policy("compute-aware", buckets=[4096], aging_per_second=3.0)
    assert isinstance(lb, LengthBuckets) and all(b.aging == 3.0 for b in lb.buckets)
    assert lb.buckets[0] is not lb.buckets[1]
    with pytest.raises(ValueError, match="fcfs, compute-aware"):
        make_policy("sjf")
    with pytest.raises(ValueError, match="aging_per_second"):
        make_policy("compute-aware", aging_per_second=-1)
    with pytest.raises(TypeError):
        make_policy("fcfs", aging_per_second=1.0)
