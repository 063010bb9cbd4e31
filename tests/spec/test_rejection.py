"""Rejection sampling keeps the target distribution: the tokens it emits are distributed as
p whatever the draft (chi-square goodness of fit at a fixed significance level), and greedy
acceptance reproduces the argmax chain exactly."""
import torch

from mimo.gpu.sampling import filtered_probs
from mimo.spec.rejection import greedy_accept, rejection_sample

N = 20000
ALPHA = 1e-3


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's goodness-of-fit p-value: the chi-square survival function is the upper
    regularized incomplete gamma Q(df / 2, stat / 2) (scipy not needed)."""
    keep = probs > 0
    assert counts[~keep].sum() == 0, "sampled a token the target gives probability 0"
    obs = counts[keep].double()
    exp = probs[keep].double() / probs[keep].double().sum() * obs.sum()
    stat = ((obs - exp) ** 2 / exp).sum()
    df = torch.tensor(float(keep.sum() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, stat / 2))


def test_greedy_accept_is_the_argmax_chain():
    assert greedy_accept([4, 5, 6], [4, 5, 6, 7]) == [4, 5, 6, 7]
    assert greedy_accept([4, 9, 6], [4, 5, 6, 7]) == [4, 5]
    assert greedy_accept([1], [2, 3]) == [2]
    assert greedy_accept([], [8]) == [8]


def _target():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 1.5],
                           [0.0, 3.0, 0.2, 0.1, 1.0, -2.0],
                           [1.0, 1.0, 1.0, 0.0, 0.0, 0.5]])
    # The request's own settings shape p: temperature 0.8, top-k 5, top-p 0.95.
    return torch.stack([filtered_probs(row, 0.8, 0.95, 5) for row in logits])


def test_first_token_is_distributed_as_p_for_a_point_mass_draft():
    p = _target()
    gen = torch.Generator().manual_seed(0)
    for x in (0, 3, 4):       # a likely draft, an unlikely one, one top-k removed (p = 0)
        counts = torch.zeros(6)
        for _ in range(N):
            counts[rejection_sample([x, 1], p, gen)[0]] += 1
        assert chi2_pvalue(counts, p[0]) > ALPHA, x


def test_second_token_given_the_first_accepted_is_distributed_as_p():
    p = _target()
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(6)
    for _ in range(N):
        out = rejection_sample([0, 2], p, gen)
        if out[0] == 0:                 # first draft accepted: the next token is p[1]'s
            counts[out[1]] += 1
    assert counts.sum() > N / 3
    assert chi2_pvalue(counts, p[1]) > ALPHA


def test_bonus_token_after_all_accepted_is_distributed_as_the_last_p():
    p = _target()
    gen = torch.Generator().manual_seed(2)
    counts = torch.zeros(6)
    for _ in range(N):
        out = rejection_sample([0, 1], p, gen)
        if out[:2] == [0, 1]:
            counts[out[2]] += 1
    assert chi2_pvalue(counts, p[2]) > ALPHA


def test_drafts_drawn_from_a_distribution_q_keep_p():
    p = _target()
    q = torch.tensor([[0.05, 0.05, 0.3, 0.3, 0.2, 0.1]])
    gen = torch.Generator().manual_seed(3)
    counts = torch.zeros(6)
    for _ in range(N):
        x = int(torch.multinomial(q[0], 1, generator=gen))
        counts[rejection_sample([x], p[:2], gen, q)[0]] += 1
    assert chi2_pvalue(counts, p[0]) > ALPHA


def test_a_wrong_sampler_is_caught_by_the_same_check():
    # Guard against a vacuous test: emitting the draft always is visibly not p.
    p = _target()
    counts = torch.zeros(6)
    counts[0] = N
    assert chi2_pvalue(counts, p[0]) < ALPHA
