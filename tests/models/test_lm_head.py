"""The greedy fast path of the LM head returns exactly the argmax of the exact logits."""
import pytest
import torch

from mimo.models.layers import Linear
from mimo.models.lm_head import LMHead


def _head(w):
    lin = Linear(w.to(torch.bfloat16))
    lin.quantize_int8()
    return LMHead(lin)


def _exact_argmax(head, h):
    w = head.linear.w_int8.float() * head.linear.w_scale.float()[:, None]
    return torch.argmax(h.float() @ w.T, dim=-1).tolist()


@pytest.mark.parametrize("rows", [1, 3, 16])
def test_matches_exact_argmax_on_random_states(rows):
    g = torch.Generator().manual_seed(rows)
    head = _head(torch.randn(5000, 64, generator=g))
    for _ in range(20):
        h = (torch.randn(rows, 64, generator=g) * 3).to(torch.bfloat16)
        assert head.greedy(h) == _exact_argmax(head, h)


def test_near_ties_and_exact_ties():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1, 64, generator=g)
    # Many rows a hair apart, and two identical rows: the lower id must win an exact tie.
    w = torch.cat([base + 1e-3 * torch.randn(300, 64, generator=g), torch.randn(2000, 64, generator=g)])
    w[150] = w[40]
    head = _head(w)
    for k in range(30):
        h = (base * (1 + 0.01 * k) + 0.05 * torch.randn(1, 64, generator=g)).to(torch.bfloat16)
        assert head.greedy(h) == _exact_argmax(head, h)
    h = head.linear.w_int8[40:41].float().to(torch.bfloat16)
    assert head.greedy(h) == _exact_argmax(head, h)


def test_without_int8_it_is_plain_argmax():
    w = torch.randn(100, 16)
    head = LMHead(Linear(w))
    h = torch.randn(4, 16)
    assert head.greedy(h) == torch.argmax(h @ w.T, dim=-1).tolist()


@pytest.mark.parametrize("rows", [1, 4])
def test_int4_screen_rescores_to_the_exact_argmax(rows):
    """Single rows through the int4 screen: the returned token is the exact int8 argmax
    (its best 64 int4 scores hold it here), with and without a grammar mask; more than
    INT4_MAX_ROWS rows take the proven path."""
    from mimo.models.lm_head import INT4_MAX_ROWS
    g = torch.Generator().manual_seed(10 + rows)
    head = _head(torch.randn(6000, 64, generator=g))
    assert head.screen_int4()
    for _ in range(20):
        h = (torch.randn(rows, 64, generator=g) * 3).to(torch.bfloat16)
        assert head.greedy(h) == _exact_argmax(head, h)
        allowed = torch.rand(rows, 6000, generator=g) < 0.01
        w = head.linear.w_int8.float() * head.linear.w_scale.float()[:, None]
        masked = (h.float() @ w.T).masked_fill(~allowed, float("-inf"))
        assert head.greedy(h, allowed) == torch.argmax(masked, dim=-1).tolist()
    big = (torch.randn(INT4_MAX_ROWS + 1, 64, generator=g) * 3).to(torch.bfloat16)
    assert head.greedy(big) == _exact_argmax(head, big)


def test_int4_screen_needs_int8_and_whole_groups():
    assert not LMHead(Linear(torch.randn(100, 64))).screen_int4()
    assert not _head(torch.randn(112, 48)).screen_int4()     # 48 is not a multiple of 32
    assert not _head(torch.randn(100, 64)).screen_int4()     # 100 rows: not 16-row tiles
