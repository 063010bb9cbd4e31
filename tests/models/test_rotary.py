"""The RoPE tables (layers.Rotary): the same bits as the construction they replaced (the
duplicated angles' sin/cos computed over the whole row, first half negated), and the
float64 math within float32 rounding."""
import math

import pytest
import torch

from mimo.models.layers import Rotary

# (dim, max_pos, theta, scaling): Gemma 3's global and local tables, Llama's, and odd sizes
SHAPES = [(256, 32768, 1_000_000.0, 1.0), (256, 32768, 10_000.0, 1.0),
          (64, 8192, 100_000.0, 1.0), (128, 4097, 10_000.0, 8.0), (6, 33, 10_000.0, 1.0),
          (2, 7, 500.0, 1.0)]


def _previous(dim, max_pos, theta, scaling, dtype):
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)) / scaling
    emb = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv).repeat(1, 2)
    sin = emb.sin()
    sin[:, : dim // 2] *= -1
    return emb.cos().to(dtype), sin.to(dtype)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tables_keep_the_previous_bits(dtype, threads):
    n = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for dim, max_pos, theta, scaling in SHAPES:
            r = Rotary(dim, theta, max_pos, scaling, dtype)
            cos, sin = _previous(dim, max_pos, theta, scaling, dtype)
            assert r.cos.dtype == dtype and torch.equal(r.cos, cos), (dim, max_pos)
            assert torch.equal(r.sin, sin) and torch.equal(r.sin.signbit(), sin.signbit())
    finally:
        torch.set_num_threads(n)


def test_tables_are_the_rotation_angles():
    dim, max_pos, theta = 64, 300, 10_000.0
    r = Rotary(dim, theta, max_pos)
    pos = torch.arange(max_pos, dtype=torch.float64)[:, None]
    inv = torch.tensor([1.0 / theta ** (2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)
    ang = (pos * inv).repeat(1, 2)
    # float32 angles of positions up to 300: a few ulps of 300 off the float64 ones
    tol = 300 * 2 ** -22
    assert torch.allclose(r.cos.double(), ang.cos(), atol=tol, rtol=0)
    sign = torch.tensor([-1.0] * (dim // 2) + [1.0] * (dim // 2), dtype=torch.float64)
    assert torch.allclose(r.sin.double(), ang.sin() * sign, atol=tol, rtol=0)
    assert math.isclose(float(r.sin[1, dim // 2]), math.sin(1.0), abs_tol=1e-7)
