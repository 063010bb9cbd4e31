"""PageAllocator bookkeeping: every page in exactly one state, checked after every operation."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mimo.kvcache.pool.allocator import DoubleFree, OutOfPages, PageAllocator


def snapshot(a: PageAllocator):
    # The free list order matters (LIFO reuse), so compare it verbatim, not as a set.
    return list(a._free), a._state.copy().tolist(), a.num_evictable


def test_fresh_and_empty():
    a = PageAllocator(8, "t")
    assert a.stats() == {"capacity": 8, "free": 8, "evictable": 0, "in_use": 0}
    a.check_integrity()
    z = PageAllocator(0)
    assert z.alloc(0) == [] and z.num_free == 0
    z.check_integrity()
    with pytest.raises(OutOfPages):
        z.alloc(1)
    with pytest.raises(ValueError):
        PageAllocator(-1)


def test_alloc_free_park_unpark_cycle():
    a = PageAllocator(10)
    p = a.alloc(4)
    assert len(set(p)) == 4 and all(0 <= x < 10 for x in p)
    assert (a.num_free, a.num_in_use, a.num_evictable) == (6, 4, 0)
    a.check_integrity()
    a.park(p[:2])
    assert (a.num_free, a.num_in_use, a.num_evictable) == (6, 2, 2)
    a.check_integrity()
    a.unpark(p[:1])
    assert (a.num_free, a.num_in_use, a.num_evictable) == (6, 3, 1)
    a.check_integrity()
    a.free([p[0], p[2], p[3]])
    assert (a.num_free, a.num_in_use, a.num_evictable) == (9, 0, 1)
    a.check_integrity()
    a.unpark([p[1]])
    a.free([p[1]])
    assert a.stats() == {"capacity": 10, "free": 10, "evictable": 0, "in_use": 0}
    a.check_integrity()


def test_alloc_zero_or_negative_is_noop():
    a = PageAllocator(3)
    before = snapshot(a)
    assert a.alloc(0) == [] and a.alloc(-2) == []
    assert snapshot(a) == before
    a.free([])
    assert snapshot(a) == before


def test_lifo_reuse():
    # Recently freed pages come back first: they are the ones still warm in cache.
    a = PageAllocator(6)
    p = a.alloc(3)
    a.free([p[1]])
    assert a.alloc(1) == [p[1]]


def test_double_free_raises_and_leaves_state():
    a = PageAllocator(5)
    p = a.alloc(2)
    a.free(p)
    before = snapshot(a)
    with pytest.raises(DoubleFree):
        a.free([p[0]])
    assert snapshot(a) == before
    a.check_integrity()


def test_free_duplicate_in_one_call_raises():
    a = PageAllocator(5)
    p = a.alloc(2)
    before = snapshot(a)
    with pytest.raises(DoubleFree):
        a.free([p[0], p[0]])
    assert snapshot(a) == before
    a.check_integrity()


def test_free_never_allocated_and_evictable_raise():
    a = PageAllocator(5)
    p = a.alloc(2)
    never = next(x for x in range(5) if x not in p)
    with pytest.raises(DoubleFree):
        a.free([never])
    a.park([p[0]])
    # An evictable page belongs to the prefix cache: it must be unparked before freeing.
    with pytest.raises(DoubleFree):
        a.free([p[0]])
    with pytest.raises(DoubleFree):
        a.park([p[0]])
    with pytest.raises(DoubleFree):
        a.unpark([p[1]])
    with pytest.raises(DoubleFree):
        a.unpark([never])
    a.check_integrity()
    assert (a.num_free, a.num_in_use, a.num_evictable) == (3, 1, 1)


def test_out_of_pages_leaves_state_unchanged():
    a = PageAllocator(7)
    a.alloc(3)
    a.park(a.alloc(2))
    before = snapshot(a)
    with pytest.raises(OutOfPages):
        a.alloc(3)           # 2 free: evictable pages are not handed out by alloc
    assert snapshot(a) == before
    a.check_integrity()
    assert len(a.alloc(2)) == 2


def test_park_unpark_duplicate_in_one_call_raises():
    # A page repeated in one call must not be counted twice (the evictable count would drift).
    a = PageAllocator(4)
    p = a.alloc(2)
    before = snapshot(a)
    with pytest.raises(DoubleFree):
        a.park([p[0], p[0]])
    with pytest.raises(DoubleFree):
        a.park([p[0], p[1], p[0]])
    assert snapshot(a) == before
    a.check_integrity()
    a.park(p)
    before = snapshot(a)
    with pytest.raises(DoubleFree):
        a.unpark([p[1], p[1]])
    assert snapshot(a) == before
    a.check_integrity()
    assert (a.num_free, a.num_in_use, a.num_evictable) == (2, 0, 2)
    a.unpark(p)
    a.free(p)
    assert a.stats() == {"capacity": 4, "free": 4, "evictable": 0, "in_use": 0}
    a.check_integrity()


def test_free_negative_page_raises():
    # numpy would wrap -1 onto page capacity-1: one physical page under two ids.
    a = PageAllocator(4)
    a.alloc(4)
    before = snapshot(a)
    with pytest.raises(ValueError):
        a.free([-1])
    assert snapshot(a) == before
    assert -1 not in a._free
    a.check_integrity()


@pytest.mark.parametrize("op", ["free", "park", "unpark"])
@pytest.mark.parametrize("bad", [-1, -4, -5, 4, 5, 1000])
def test_out_of_range_page_ids_raise_value_error(op, bad):
    a = PageAllocator(4)
    p = a.alloc(3)
    a.park([p[2]])
    before = snapshot(a)
    with pytest.raises(ValueError):
        getattr(a, op)([bad])
    # A bad id next to valid ones: nothing of the call is applied.
    valid = p[2] if op == "unpark" else p[0]
    with pytest.raises(ValueError):
        getattr(a, op)([valid, bad])
    assert snapshot(a) == before
    a.check_integrity()
    assert (a.num_free, a.num_in_use, a.num_evictable) == (1, 2, 1)


# ---- random sequences against a brute-force model -----------------------------------------

def run_random_ops(capacity: int, seed: int, steps: int) -> None:
    rng = random.Random(seed)
    a = PageAllocator(capacity)
    held: set[int] = set()       # IN_USE in the model
    parked: set[int] = set()     # EVICTABLE in the model
    for _ in range(steps):
        op = rng.choice(["alloc", "alloc", "free", "park", "unpark", "bad_free", "bad_alloc"])
        free_n = capacity - len(held) - len(parked)
        if op == "alloc":
            n = rng.randint(0, free_n)
            got = a.alloc(n)
            assert len(got) == len(set(got)) == n
            assert not set(got) & (held | parked)
            held |= set(got)
        elif op == "bad_alloc":
            before = snapshot(a)
            with pytest.raises(OutOfPages):
                a.alloc(free_n + rng.randint(1, 3))
            assert snapshot(a) == before
        elif op in ("free", "park") and held:
            pick = rng.sample(sorted(held), rng.randint(1, len(held)))
            (a.free if op == "free" else a.park)(pick)
            held -= set(pick)
            if op == "park":
                parked |= set(pick)
        elif op == "unpark" and parked:
            pick = rng.sample(sorted(parked), rng.randint(1, len(parked)))
            a.unpark(pick)
            parked -= set(pick)
            held |= set(pick)
        elif op == "bad_free":
            not_held = [p for p in range(capacity) if p not in held]
            if not_held:
                before = snapshot(a)
                with pytest.raises(DoubleFree):
                    a.free([rng.choice(not_held)])
                assert snapshot(a) == before
        a.check_integrity()
        assert a.num_in_use == len(held) and a.num_evictable == len(parked)
        assert a.num_free + a.num_evictable + a.num_in_use == a.capacity
        assert set(a._free) == set(range(capacity)) - held - parked


@given(capacity=st.integers(0, 40), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=150, deadline=None)
def test_random_sequences_vs_set_model(capacity, seed):
    run_random_ops(capacity, seed, steps=60)


class AllocatorMachine(RuleBasedStateMachine):
    """Hypothesis-driven: shrinks a failing op sequence to a minimal one."""

    def __init__(self):
        super().__init__()
        self.cap = 12
        self.a = PageAllocator(self.cap)
        self.held: set[int] = set()
        self.parked: set[int] = set()

    @rule(n=st.integers(0, 14))
    def alloc(self, n):
        free_n = self.cap - len(self.held) - len(self.parked)
        if n > free_n:
            before = snapshot(self.a)
            with pytest.raises(OutOfPages):
                self.a.alloc(n)
            assert snapshot(self.a) == before
        else:
            got = self.a.alloc(n)
            assert not set(got) & (self.held | self.parked) and len(set(got)) == n
            self.held |= set(got)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), park=st.booleans())
    def release(self, data, park):
        pick = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, unique=True))
        (self.a.park if park else self.a.free)(pick)
        self.held -= set(pick)
        if park:
            self.parked |= set(pick)

    @precondition(lambda self: self.parked)
    @rule(data=st.data())
    def unpark(self, data):
        pick = data.draw(st.lists(st.sampled_from(sorted(self.parked)), min_size=1, unique=True))
        self.a.unpark(pick)
        self.parked -= set(pick)
        self.held |= set(pick)

    @rule(page=st.integers(0, 11))
    def free_unheld(self, page):
        if page in self.held:
            return
        before = snapshot(self.a)
        with pytest.raises(DoubleFree):
            self.a.free([page])
        assert snapshot(self.a) == before

    @invariant()
    def accounting(self):
        self.a.check_integrity()
        assert self.a.num_in_use == len(self.held)
        assert self.a.num_evictable == len(self.parked)
        assert self.a.num_free == self.cap - len(self.held) - len(self.parked)


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
