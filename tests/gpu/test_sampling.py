"""Sampling rules checked against their definitions on toy distributions."""

import torch

from mimo import SamplingParams
from mimo.gpu.sampling import sample, sample_row

LOGITS = torch.log(torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04]))


def _freq(n, **kw):
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(len(LOGITS))
    for _ in range(n):
        counts[sample_row(LOGITS, generator=g, **kw)] += 1
    return counts / n


def _chi2_ok(freq, probs, n):
    """Pearson chi-square below the 0.999 quantile (generous: fails only on real bias)."""
    mask = probs > 0
    assert (freq[~mask] == 0).all(), "sampled a token the filter removed"
    stat = float(((freq[mask] - probs[mask]) ** 2 / probs[mask]).sum() * n)
    df = int(mask.sum()) - 1
    return stat < {1: 10.8, 2: 13.8, 3: 16.3, 4: 18.5, 5: 20.5}[df]


def test_temperature_one_samples_the_softmax():
    n = 6000
    assert _chi2_ok(_freq(n, temperature=1.0, top_p=1.0, top_k=0), torch.softmax(LOGITS, 0), n)


def test_temperature_sharpens():
    n = 6000
    want = torch.softmax(LOGITS / 0.5, 0)
    assert _chi2_ok(_freq(n, temperature=0.5, top_p=1.0, top_k=0), want, n)


def test_top_k_renormalises_the_k_best():
    n = 6000
    want = torch.tensor([0.4, 0.25, 0.15, 0, 0, 0])
    assert _chi2_ok(_freq(n, temperature=1.0, top_p=1.0, top_k=3), want / want.sum(), n)


def test_top_p_keeps_smallest_prefix_reaching_p():
    n = 6000
    # 0.4 + 0.25 = 0.65 < 0.7 <= 0.8: the first three stay.
    want = torch.tensor([0.4, 0.25, 0.15, 0, 0, 0])
    assert _chi2_ok(_freq(n, temperature=1.0, top_p=0.7, top_k=0), want / want.sum(), n)


class _Head:
    """Hidden states are the logits themselves."""
    def logits(self, h):
        return h.float()

    def greedy(self, h):
        return torch.argmax(h, dim=-1).tolist()


def test_greedy_is_argmax_and_ignores_generator():
    assert sample_row(LOGITS, 0.0, 0.5, 2, None) == 0
    logits = torch.stack([LOGITS, LOGITS.flip(0)])
    assert sample(_Head(), logits, [SamplingParams(temperature=0)] * 2, [None, None]) == [0, 5]


def test_mixed_batch_routes_rows_to_their_rule():
    logits = torch.stack([LOGITS, LOGITS.flip(0), LOGITS])
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=1),
              SamplingParams(temperature=0)]
    gens = [None, torch.Generator().manual_seed(0), None]
    assert sample(_Head(), logits, params, gens) == [0, 5, 0]


def test_seeded_sampling_is_reproducible():
    a = [sample_row(LOGITS, 1.0, 1.0, 0, torch.Generator().manual_seed(s)) for s in range(20)]
    b = [sample_row(LOGITS, 1.0, 1.0, 0, torch.Generator().manual_seed(s)) for s in range(20)]
    assert a == b and len(set(a)) > 1
