"""Waiting-queue policies: the order in which waiting requests are tried for admission.

A policy holds the waiting requests (any hashable objects; the engine's `Sequence`). Time is
passed in explicitly (`now`, seconds on any monotonic clock), so policies are deterministic.
Integration, one step of the scheduler (`fits` = the scheduler's own memory check):

    turn = policy.next_bucket()            # None: nothing waiting
    if turn is not None and prefill_bucket in (None, turn):   # one length bucket per batch
        for seq in policy.candidates(now, bucket=turn):
            if out of token budget or seats: break
            if fits(seq): policy.pop(seq); admit(seq)
            elif policy.may_skip(seq, now): continue   # try the next (smaller) one
            else: break                                # head-of-line block: wait for memory

`prefill_bucket` is `policy.bucket_of(r)` of any running request still in prefill (None when
there is none), so requests of different length buckets never share a prefill batch; admitting
waits until the running prefills of another bucket finish. `remove(seq)` is for aborts.

Head-of-line rule. FCFS never skips: the first request that does not fit blocks the rest.
ComputeAware lets later requests pass one that does not fit until it is overdue (`now >=
deadline(seq)`); then it blocks all behind it, so small ones cannot keep taking the memory it
waits for. All ordered before an overdue request are overdue too: nothing passes it.
"""
from __future__ import annotations

import bisect
import heapq
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from typing import Any


class WaitingPolicy(ABC):
    """Waiting requests in admission order. push O(log n), remove O(1), walking the first k
    candidates O(k log k) after an O(n) snapshot copy; safe to push/remove while walking."""
    num_buckets = 1

    def __init__(self) -> None:
        self._since: dict[Any, float] = {}

    def __len__(self) -> int:
        return len(self._since)

    def __contains__(self, seq) -> bool:
        return seq in self._since

    def __iter__(self) -> Iterator:
        return self.candidates()

    def push(self, seq, now: float, since: float | None = None) -> None:
        """Add a waiting request. `since`: when it began waiting (default `now`); pass the
        original time when re-queueing a preempted request so it keeps its age."""
        if seq in self._since:
            raise ValueError("request is already waiting")
        self._since[seq] = now if since is None else since
        self._add(seq, self._since[seq])

    def remove(self, seq) -> None:
        """Drop a waiting request (e.g. aborted). KeyError if it is not waiting."""
        del self._since[seq]
        self._drop(seq)

    def pop(self, seq):
        """Take a request out because it is being admitted; returns it."""
        self.remove(seq)
        return seq

    def waited(self, seq, now: float) -> float:
        return now - self._since[seq]

    def bucket_of(self, seq) -> int:
        """Length bucket of any request (waiting or running); 0 without buckets."""
        return 0

    def next_bucket(self) -> int | None:
        """The bucket whose turn it is to admit; None when nothing waits."""
        return 0 if self._since else None

    def may_skip(self, seq, now: float) -> bool:
        """May the scheduler try later candidates when `seq` does not fit? (No: block.)"""
        return False

    @abstractmethod
    def candidates(self, now: float | None = None, bucket: int | None = None) -> Iterator:
        """Waiting requests in the order to try admitting them (only `bucket`'s, if given)."""

    @abstractmethod
    def _add(self, seq, since: float) -> None: """Store a pushed request."""

    @abstractmethod
    def _drop(self, seq) -> None: """Forget a removed request."""


class _KeyedHeap(WaitingPolicy):
    """Order by a key fixed at push (ties: push order) in a heap with lazy deletion."""

    def __init__(self) -> None:
        super().__init__()
        self._heap: list[list] = []          # [key, push number, seq or None if removed, cost]
        self._entry: dict[Any, list] = {}
        self._n = 0

    @abstractmethod
    def _rank(self, seq, since: float) -> tuple[float, float]:
        """(order key, cost) of a request waiting since `since`."""

    def _add(self, seq, since: float) -> None:
        key, cost = self._rank(seq, since)
        e = self._entry[seq] = [key, self._n, seq, cost]
        self._n += 1
        heapq.heappush(self._heap, e)
        if len(self._heap) > 2 * len(self._entry) + 32:      # compact removed entries
            self._heap = [x for x in self._heap if x[2] is not None]
            heapq.heapify(self._heap)

    def _drop(self, seq) -> None:
        self._entry.pop(seq)[2] = None
        while self._heap and self._heap[0][2] is None:      # admissions mostly take the top
            heapq.heappop(self._heap)

    def candidates(self, now: float | None = None, bucket: int | None = None) -> Iterator:
        heap = list(self._heap)             # snapshot: pushes reorder self._heap in place
        frontier = [(heap[0], 0)] if heap else []
        while frontier:                     # best-first walk of the heap: sorted, lazily
            e, i = heapq.heappop(frontier)
            if e[2] is not None:
                yield e[2]
            for c in (2 * i + 1, 2 * i + 2):
                if c < len(heap):
                    heapq.heappush(frontier, (heap[c], c))


class FCFS(_KeyedHeap):
    """First come, first served: by `since` (arrival), ties in push order. Never skips."""

    def _rank(self, seq, since: float) -> tuple[float, float]:
        return since, 0.0


class ComputeAware(_KeyedHeap):
    """Fewest uncached prompt tokens first, with aging. With u = uncached(seq) (clamped to
    [0, max_uncached]), a = aging_per_second and t = since, a request's priority is
    u - a*(now - t), lower first; that is the fixed key u + a*t minus a*now, so the order
    never changes with time and a heap keeps it.

    Bound. A request r pushed after deadline(s) = t_s + u_s/a has key >= a*t_r > key(s), so it
    is ordered after s: s is passed only by requests arriving within u_s/a <= max_uncached/a
    seconds of it, and (with the may_skip rule) by nothing after its deadline. Hence

        wait(s) <= u_s/a + drain(t_s + u_s/a)

    where drain(T) is the time to finish the work queued or running at T (FCFS: wait(s) <=
    drain(t_s)). If the backlog stays <= B uncached tokens and the engine computes C tokens/s,
    wait(s) <= max_uncached/a + B/C. a = 0 is pure shortest-first: no bound, it can starve.
    """

    def __init__(self, aging_per_second: float = 1000.0,
                 uncached: Callable[[Any], int] | None = None, max_uncached: int | None = None):
        super().__init__()
        if not aging_per_second >= 0:
            raise ValueError(f"aging_per_second must be >= 0, got {aging_per_second}")
        if max_uncached is not None and max_uncached < 0:
            raise ValueError(f"max_uncached must be >= 0, got {max_uncached}")
        self.aging = float(aging_per_second)
        self.max_uncached = max_uncached
        self._uncached = uncached or (lambda s: len(s.prompt_ids) - s.cached_tokens)

    def uncached_tokens(self, seq) -> int:
        u = max(0, int(self._uncached(seq)))
        return u if self.max_uncached is None else min(u, self.max_uncached)

    def _rank(self, seq, since: float) -> tuple[float, float]:
        u = self.uncached_tokens(seq)
        return u + self.aging * since, u

    def priority(self, seq, now: float) -> float:
        """u - a*waited: lower is admitted first."""
        return self._entry[seq][0] - self.aging * now

    def deadline(self, seq) -> float:
        """since + u/a: no request pushed later goes before `seq`; from then on it blocks."""
        return self._entry[seq][0] / self.aging if self.aging else math.inf

    def may_skip(self, seq, now: float) -> bool:
        return now < self.deadline(seq)


class LengthBuckets(WaitingPolicy):
    """Requests split by prompt length into buckets, each with its own inner policy.

    `boundaries` are the cut points: [4096, 16384] gives [0, 4096), [4096, 16384),
    [16384, inf) (a leading 0 or trailing inf is ignored). Buckets take turns: after a request
    of bucket b is admitted (`pop`), bucket b+1 (or the next non-empty one) has the turn, so a
    waiting bucket gets it after at most num_buckets - 1 batches of others. Within a bucket
    the inner policy orders, skips and blocks; its wait bound then holds per bucket, counting
    the other buckets' turns as work ahead.
    """

    def __init__(self, boundaries: Seq[float], inner: Callable[[], WaitingPolicy] = FCFS,
                 length: Callable[[Any], int] | None = None):
        super().__init__()
        cuts = [float(b) for b in boundaries if 0 < b < math.inf]
        if cuts != sorted(set(cuts)):
            raise ValueError(f"boundaries must be strictly increasing, got {list(boundaries)}")
        self.boundaries = cuts
        self.buckets = [inner() for _ in range(len(cuts) + 1)]
        self._length = length or (lambda s: len(s.prompt_ids))
        self._where: dict[Any, int] = {}
        self._turn = 0

    num_buckets = property(lambda self: len(self.buckets))

    def bucket_of(self, seq) -> int:
        return bisect.bisect_right(self.boundaries, self._length(seq))

    def _add(self, seq, since: float) -> None:
        b = self._where[seq] = self.bucket_of(seq)
        self.buckets[b].push(seq, since)

    def _drop(self, seq) -> None:
        self.buckets[self._where.pop(seq)].remove(seq)

    def pop(self, seq):
        b = self._where[seq]
        self.remove(seq)
        self._turn = (b + 1) % len(self.buckets)
        return seq

    def _order(self) -> list[int]:
        n = len(self.buckets)
        return [(self._turn + k) % n for k in range(n)]

    def next_bucket(self) -> int | None:
        return next((b for b in self._order() if len(self.buckets[b])), None)

    def candidates(self, now: float | None = None, bucket: int | None = None) -> Iterator:
        for b in [bucket] if bucket is not None else self._order():
            yield from self.buckets[b].candidates(now)

    def may_skip(self, seq, now: float) -> bool:
        return self.buckets[self._where[seq]].may_skip(seq, now)


POLICIES = {"fcfs": FCFS, "compute-aware": ComputeAware}


def make_policy(name: str, buckets: Seq[float] | None = None, **opts) -> WaitingPolicy:
    """'fcfs' or 'compute-aware' (options: aging_per_second, uncached, max_uncached);
    with `buckets` (cut points), wrapped in LengthBuckets."""
    key = name.strip().lower().replace("_", "-")
    if key not in POLICIES:
        raise ValueError(f"unknown waiting policy {name!r}; valid: {', '.join(POLICIES)}")
    cls = POLICIES[key]
    if buckets is not None:
        return LengthBuckets(buckets, inner=lambda: cls(**opts))
    return cls(**opts)
