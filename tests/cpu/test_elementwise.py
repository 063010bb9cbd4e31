"""The C++ elementwise ops (csrc/elementwise.cpp, each build this CPU runs) against float64
math and against the plain layers' own PyTorch ops: RMSNorm with a [n] or a per-head [h, n]
scale and GELU-tanh / SiLU gated products, float32 and bfloat16, odd widths (vector tails)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mimo.cpu import elementwise, extension
from mimo.cpu.features import ISAS, cpu_info
from mimo.models.layers import RMSNorm
from mimo.models.mlp import ACTIVATIONS, GatedMLP

BUILDS = [i for i in ISAS if cpu_info().supports(i)]


def _ulps_bf16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bfloat16 steps between two bf16 tensors of finite values."""
    ia = a.view(torch.int16).int()
    ib = b.view(torch.int16).int()
    ia = torch.where(ia < 0, -32768 - ia, ia)        # sign-magnitude -> ordered integers
    ib = torch.where(ib < 0, -32768 - ib, ib)
    return (ia - ib).abs()


@pytest.mark.parametrize("isa", BUILDS)
@pytest.mark.parametrize("n", [640, 256, 37])
@pytest.mark.parametrize("heads", [0, 4])
def test_rms_norm_matches_float64(isa, n, heads):
    ext = extension.load(isa)
    g = torch.Generator().manual_seed(n + heads)
    rows = 4 * 33
    x = 3 * torch.randn(rows, n, generator=g)
    scale = 1 + 0.3 * torch.randn(heads or 1, n, generator=g)
    scale = scale[0] if not heads else scale
    x64 = x.double()
    rr = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)
    s64 = scale.double() if not heads else scale.double().repeat(rows // heads, 1)
    want = x64 * rr * s64
    y = ext.rms_norm_rows(x, scale.contiguous(), 1e-6)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), want, rtol=2e-6, atol=2e-6)
    # bfloat16 in and out: the float64 value rounded once, give or take one step
    xb = x.bfloat16()
    xb64 = xb.double()
    want_b = (xb64 * torch.rsqrt(xb64.pow(2).mean(-1, keepdim=True) + 1e-6) * s64).bfloat16()
    yb = ext.rms_norm_rows(xb, scale.contiguous(), 1e-6)
    assert yb.dtype == torch.bfloat16
    d = _ulps_bf16(yb, want_b)
    assert d.max() <= 1 and (d > 0).float().mean() < 0.01


def _act_ref(gu64: torch.Tensor, act: str, dtype: torch.dtype) -> torch.Tensor:
    """The plain layer's rounding in float64 math: act(g) rounded to dtype, times u, rounded."""
    half = gu64.shape[1] // 2
    g, u = gu64[:, :half], gu64[:, half:]
    a = F.gelu(g, approximate="tanh") if act == "gelu_pytorch_tanh" else F.silu(g)
    return (a.to(dtype).double() * u).to(dtype)


@pytest.mark.parametrize("isa", BUILDS)
@pytest.mark.parametrize("act", ["gelu_pytorch_tanh", "silu"])
@pytest.mark.parametrize("width", [2048, 19])
def test_act_mul_matches_float64(isa, act, width):
    ext = extension.load(isa)
    g = torch.Generator().manual_seed(width)
    gu = 2.5 * torch.randn(70, 2 * width, generator=g)
    name = elementwise.ACTS[act]
    y = ext.act_mul_rows(gu, name)
    # absolute: where gelu is near 0, 1 + tanh cancels in float32 (in torch's formula too)
    torch.testing.assert_close(y.double(), _act_ref(gu.double(), act, torch.float32).double(),
                               rtol=1e-5, atol=1e-5)
    # bfloat16: the plain layer's own ops are the reference. Both round where 1 + tanh
    # cancels (gelu of x < -4, ~1e-5 and less) differently, so that tail may differ in its
    # last steps; elsewhere they are equal (a dropped rounding step parts half of them).
    gb = gu.bfloat16()
    yb = ext.act_mul_rows(gb, name)
    assert yb.dtype == torch.bfloat16 and yb.shape == (70, width)
    ref = ACTIVATIONS[act](gb[:, :width]) * gb[:, width:]
    torch.testing.assert_close(yb.float(), ref.float(), rtol=2 ** -7, atol=1e-4)
    assert (yb == ref).float().mean() > 0.95


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layers_take_the_kernels_and_agree_with_torch(dtype):
    assert extension.load() is not None
    g = torch.Generator().manual_seed(3)
    norm = RMSNorm(96, 1e-6, 0.2 * torch.randn(96, generator=g))
    x = torch.randn(40, 96, generator=g).to(dtype)
    with torch.no_grad():
        y = norm(x)
        assert elementwise.rms_norm(x, norm.scale, norm.eps) is not None
        want = F.rms_norm(x.float(), (96,), norm.scale, 1e-6).to(dtype)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y.float(), want.float(), rtol=tol, atol=tol)
    mlp = GatedMLP(0.1 * torch.randn(2 * 48, 96, generator=g).to(dtype),
                   0.1 * torch.randn(96, 48, generator=g).to(dtype), "gelu_pytorch_tanh")
    with torch.no_grad():
        out = mlp(x)
        gate, up = F.linear(x, mlp.gate_up.weight).chunk(2, -1)
        ref = F.linear(ACTIVATIONS["gelu_pytorch_tanh"](gate) * up, mlp.down.weight)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    # where autograd records (training, not serving) the layers keep the torch ops
    with torch.enable_grad():
        assert elementwise.rms_norm(x, norm.scale, 1e-6) is None
        assert elementwise.act_mul(torch.randn(4, 8), "silu") is None


def test_bad_inputs_are_refused():
    ext = extension.load()
    assert ext is not None
    with pytest.raises(RuntimeError, match="contiguous 2-D"):
        ext.rms_norm_rows(torch.randn(4, 8).half(), torch.ones(8), 1e-6)
    with pytest.raises(RuntimeError, match="scale must be"):
        ext.rms_norm_rows(torch.randn(4, 8), torch.ones(7), 1e-6)
    with pytest.raises(RuntimeError, match="multiple of the scale's rows"):
        ext.rms_norm_rows(torch.randn(5, 8), torch.ones(2, 8), 1e-6)
    with pytest.raises(RuntimeError, match=r"\[T, 2I\]"):
        ext.act_mul_rows(torch.randn(4, 7), "silu")
    with pytest.raises(RuntimeError, match="gelu_tanh or silu"):
        ext.act_mul_rows(torch.randn(4, 8), "relu")
