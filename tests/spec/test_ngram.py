"""The n-gram (prompt lookup) drafter: longest match first, most recent occurrence, copies
past the end of a short period, and its incremental index agrees with a fresh one."""
import random

from mimo.spec.ngram import NgramDrafter, _Index


def propose(toks, k=4, max_n=4, min_n=1):
    return NgramDrafter(max_n, min_n).propose_one(list(toks), _Index(), k)


def test_copies_what_followed_the_match():
    assert propose([5, 6, 7, 8, 9, 1, 2, 5, 6]) == [7, 8, 9, 1]


def test_longest_ngram_wins_over_a_more_recent_short_one():
    # "3 4" last seen followed by 9; but "2 3 4" (longer) was followed by 7.
    toks = [2, 3, 4, 7, 1, 3, 4, 9, 2, 3, 4]
    assert propose(toks, k=1) == [7]


def test_most_recent_occurrence_of_the_same_ngram():
    toks = [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3]
    assert propose(toks, k=1) == [8]


def test_no_match_gives_no_draft_and_min_n_is_respected():
    assert propose([1, 2, 3, 4]) == []
    assert propose([1, 2, 3, 1], min_n=2) == []
    assert propose([1, 2, 3, 1], min_n=1) == [2, 3, 1, 2]


def test_short_period_continues_past_the_end():
    assert propose([4, 7, 4, 7, 4], k=5) == [7, 4, 7, 4, 7]
    assert propose([3, 3, 3], k=4) == [3, 3, 3, 3]


def test_incremental_index_matches_a_fresh_one():
    rng = random.Random(0)
    d = NgramDrafter(4, 1)
    idx = _Index()
    toks = [rng.randrange(6) for _ in range(5)]
    for _ in range(300):
        got = d.propose_one(toks, idx, 3)
        assert got == d.propose_one(toks, _Index(), 3)
        toks.extend(rng.randrange(6) for _ in range(rng.randint(1, 4)))


def test_per_sequence_state_is_dropped_when_finished():
    class Seq:
        def __init__(self, ids):
            self.all_ids = ids
    d = NgramDrafter()
    a, b = Seq([1, 2, 1]), Seq([5, 6, 7, 5])
    assert d.propose([a, b], 2) == [[2, 1], [6, 7]]
    assert len(d._index) == 2
    d.on_finished(a)
    assert len(d._index) == 1
