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


def test_bf16_logits_that_tie_are_rescored_in_float32():
    """bf16 logits sit 0.125 apart at 16-32: two tokens whose float32 logits are 20.01 and
    20.05 both round to 20.0, and a plain argmax takes the lower id. The head rescores the
    tokens within one bf16 step of the best in float32: the float64 argmax wins."""
    g = torch.Generator().manual_seed(3)
    h = torch.zeros(2, 64, dtype=torch.bfloat16)
    h[:, :2] = 1.0
    w = torch.randn(500, 64, generator=g) * 0.1
    w[:, 0] = torch.rand(500, generator=g) * 10          # logits 0..10 from the first column
    w[7, :2] = torch.tensor([20.0, 0.01])
    w[300, :2] = torch.tensor([20.0, 0.05])
    h[1, 2] = 1.0                                         # row 1: a third column moves all
    head = LMHead(Linear(w.to(torch.bfloat16)))
    bf = head.linear(h)
    assert bf[0, 7] == bf[0, 300]                         # the bf16 logits tie
    want = torch.argmax(h.double() @ head.linear.weight.double().T, dim=-1).tolist()
    assert want[0] == 300
    assert head.greedy(h) == want
    # a grammar's mask still applies: with 300 disallowed, 7 wins
    allowed = torch.ones(2, 500, dtype=torch.bool)
    allowed[:, 300] = False
    masked = h.double() @ head.linear.weight.double().T
    masked[:, 300] = float("-inf")
    assert head.greedy(h, allowed) == torch.argmax(masked, dim=-1).tolist()


def test_bf16_rows_each_get_the_exact_argmax():
    """48 rows of bf16 logits (no int8 copy): each row's answer is the float64 argmax of
    its product (the rows with near-ties rescored, the others taken as they are)."""
    g = torch.Generator().manual_seed(11)
    w = torch.randn(3000, 64, generator=g)
    w[1000:1100] = w[2000:2100] + 1e-3 * torch.randn(100, 64, generator=g)  # near-twins
    head = LMHead(Linear(w.to(torch.bfloat16)))
    h = (torch.randn(48, 64, generator=g) * 3).to(torch.bfloat16)
    h[::4] = head.linear.weight[2000:2012].float().mul(4).to(torch.bfloat16)    # twins win
    want = torch.argmax(h.double() @ head.linear.weight.double().T, dim=-1).tolist()
    assert head.greedy(h) == want
