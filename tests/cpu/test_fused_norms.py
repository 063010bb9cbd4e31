"""The fused norm kernels (csrc/fused_norms.cpp, each build this CPU runs) against the
unfused calls they replace, bit for bit, and against float64 math: the q/k heads' RMSNorm
with RoPE read from the qkv rows, and the residual sum with the norms around it; odd head
widths and row widths (vector tails), bfloat16 and float32. Also: the 16-lane gated product
of the AVX-512 build gives the AVX2 build's bits, and the modules take the fused path."""
from __future__ import annotations

import pytest
import torch

from mimo.cpu import elementwise, extension
from mimo.cpu.features import ISAS, cpu_info
from mimo.models.layers import RMSNorm, Rotary, add_norm

BUILDS = [i for i in ISAS if cpu_info().supports(i)]
EPS = 1e-6


def _tables(T: int, d: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary's tables for T random positions: [T, 1, d] in dtype, sin sign-folded."""
    rope = Rotary(d, 10000.0, 4096, dtype=dtype)
    pos = torch.randint(0, 4096, (T,), generator=torch.Generator().manual_seed(seed))
    return rope.tables(pos)


def _qkv(T, heads, d, extra, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(T, heads * d + extra, generator=g)).to(dtype), \
        1 + 0.3 * torch.randn(heads, d, generator=g)


@pytest.mark.parametrize("isa", BUILDS)
@pytest.mark.parametrize("d", [256, 38, 22])
@pytest.mark.parametrize("normed", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_qk_norm_rope_is_the_norm_then_the_rotation(isa, d, normed, dtype):
    ext = extension.load(isa)
    T, heads = 33, 5
    qkv, scale = _qkv(T, heads, d, 3 * d + 1, dtype, d)
    cos, sin = _tables(T, d, dtype, d)
    got = ext.qk_norm_rope_rows(qkv, heads, d, scale if normed else torch.empty(0), EPS,
                                cos.view(T, d).contiguous(), sin.view(T, d).contiguous())
    x = qkv[:, :heads * d].contiguous().view(T * heads, d)
    if normed:      # the unfused calls: the norm kernel, then Rotary's torch ops
        x = ext.rms_norm_rows(x, scale.contiguous(), EPS)
    want = Rotary.rotate(x.view(T, heads, d), (cos, sin))
    assert got.dtype == dtype and got.shape == (T, heads, d)
    if dtype == torch.bfloat16:
        assert torch.equal(got, want)
    else:           # the compiler may fuse a product and the sum (one rounding fewer)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("isa", BUILDS)
@pytest.mark.parametrize("d", [256, 38])
def test_qk_norm_rope_matches_float64(isa, d):
    ext = extension.load(isa)
    T, heads = 17, 3
    qkv, scale = _qkv(T, heads, d, 0, torch.float32, 7 + d)
    cos, sin = _tables(T, d, torch.float32, 7)
    got = ext.qk_norm_rope_rows(qkv, heads, d, scale, EPS, cos.view(T, d).contiguous(),
                                sin.view(T, d).contiguous())
    x = qkv.double().view(T, heads, d)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * scale.double()
    c, s = cos.double(), sin.double()
    half = d // 2
    swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1)
    want = x * c + swapped * s
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", BUILDS)
@pytest.mark.parametrize("n", [640, 37])
@pytest.mark.parametrize("hdtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("norms", ["both", "first", "second", "none"])
def test_add_rms_norm_is_the_norm_the_sum_and_the_next_norm(isa, n, hdtype, norms):
    ext = extension.load(isa)
    g = torch.Generator().manual_seed(n)
    rows = 41
    x = 3 * torch.randn(rows, n, generator=g)
    h = (2 * torch.randn(rows, n, generator=g)).to(hdtype)
    w1 = 1 + 0.3 * torch.randn(n, generator=g)
    w2 = 1 + 0.3 * torch.randn(n, generator=g)
    a = w1 if norms in ("both", "first") else torch.empty(0)
    b = w2 if norms in ("both", "second") else torch.empty(0)
    xn, y = ext.add_rms_norm_rows(x, h, a, b, EPS)
    # the unfused calls: the norm kernel in h's dtype, a float32 sum, the norm kernel on it
    want_x = x + (ext.rms_norm_rows(h, w1, EPS) if a.numel() else h)
    assert xn.dtype == torch.float32 and torch.equal(xn, want_x)
    if b.numel():
        assert torch.equal(y, ext.rms_norm_rows(want_x, w2, EPS))
    else:
        assert y.numel() == 0
    # y_bf16: the second norm rounded to bfloat16 as torch casts it, the sum the same
    xn16, y16 = ext.add_rms_norm_rows(x, h, a, b, EPS, True)
    assert torch.equal(xn16, xn) and y16.dtype == torch.bfloat16
    assert torch.equal(y16.view(torch.int16), y.to(torch.bfloat16).view(torch.int16))
    # float64: the first norm rounded to h's dtype, the rest in float64
    r = h.double()
    if a.numel():
        r = (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + EPS) * w1.double()).to(hdtype).double()
    s64 = x.double() + r
    tol = 1e-5
    torch.testing.assert_close(xn.double(), s64, rtol=tol, atol=tol)
    if b.numel():
        y64 = s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + EPS) * w2.double()
        torch.testing.assert_close(y.double(), y64, rtol=tol, atol=tol)


@pytest.mark.parametrize("act", ["gelu_tanh", "silu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("width", [2048, 27, 19, 5])
def test_act_mul_builds_agree_bit_for_bit(act, dtype, width):
    """The AVX-512 build's 16-lane loop runs the AVX2 build's operations per element."""
    if len(BUILDS) < 2:
        pytest.skip("one kernel build on this CPU: nothing to compare")
    gu = (3 * torch.randn(23, 2 * width, generator=torch.Generator().manual_seed(width))).to(dtype)
    outs = [extension.load(isa).act_mul_rows(gu, act) for isa in BUILDS]
    for o in outs[1:]:
        assert torch.equal(o, outs[0])


def test_bad_inputs_are_refused():
    ext = extension.load()
    assert ext is not None
    T, d = 4, 8
    tab = torch.randn(T, d)
    with pytest.raises(RuntimeError, match="must fit in qkv's columns"):
        ext.qk_norm_rope_rows(torch.randn(T, 15), 2, d, torch.empty(0), EPS, tab, tab)
    with pytest.raises(RuntimeError, match="cos and sin"):
        ext.qk_norm_rope_rows(torch.randn(T, 16), 2, d, torch.empty(0), EPS, tab.bfloat16(), tab)
    with pytest.raises(RuntimeError, match="scale must be"):
        ext.qk_norm_rope_rows(torch.randn(T, 16), 2, d, torch.ones(d), EPS, tab, tab)
    with pytest.raises(RuntimeError, match="residual stream"):
        ext.add_rms_norm_rows(torch.randn(T, d).bfloat16(), torch.randn(T, d), torch.empty(0),
                              torch.empty(0), EPS)
    with pytest.raises(RuntimeError, match="x's shape"):
        ext.add_rms_norm_rows(torch.randn(T, d), torch.randn(T, d + 1), torch.empty(0),
                              torch.empty(0), EPS)
    with pytest.raises(RuntimeError, match="w2 must be"):
        ext.add_rms_norm_rows(torch.randn(T, d), torch.randn(T, d), torch.empty(0),
                              torch.ones(d + 1), EPS)


class _Counting:
    """The extension, counting the fused calls that go through it."""

    def __init__(self, ext):
        self.ext, self.calls = ext, {"qk_norm_rope_rows": 0, "add_rms_norm_rows": 0}

    def __getattr__(self, name):
        if name in self.calls:
            self.calls[name] += 1
        return getattr(self.ext, name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_modules_take_the_fused_path_with_the_same_values(monkeypatch, dtype):
    ext = extension.load()
    assert ext is not None
    counting = _Counting(ext)
    monkeypatch.setattr(elementwise.extension, "load", lambda: counting)
    g = torch.Generator().manual_seed(5)
    T, heads, d, n = 9, 3, 64, 96
    qkv = torch.randn(T, heads * d + 2 * d, generator=g).to(dtype)
    qk_norm = RMSNorm(d, EPS, torch.cat([0.2 * torch.randn(d, generator=g)] * heads).view(heads, d))
    tables = _tables(T, d, dtype, 1)
    norm_a, norm_b = (RMSNorm(n, EPS, 0.2 * torch.randn(n, generator=g)) for _ in range(2))
    x, h = torch.randn(T, n, generator=g), torch.randn(T, n, generator=g).to(dtype)
    with torch.no_grad():
        got_qk = Rotary.norm_rotate(qkv, heads, d, qk_norm, tables)
        got_x, got_y = add_norm(x, h, norm_a, norm_b)
        assert counting.calls == {"qk_norm_rope_rows": 1, "add_rms_norm_rows": 1}
        want_qk = Rotary.rotate(qk_norm(qkv[:, :heads * d].view(T, heads, d)), tables)
        want_x = x + norm_a(h)
        want_y = norm_b(want_x)
    tol = 0 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(got_qk, want_qk, rtol=tol, atol=tol)
    assert torch.equal(got_x, want_x) and got_y is not None and torch.equal(got_y, want_y)
    # y in the next matmul's bfloat16, fused and through the modules: the float32 y, cast
    with torch.no_grad():
        fused = add_norm(x, h, norm_a, norm_b, torch.bfloat16)
        monkeypatch.setattr(elementwise.extension, "load", lambda: None)
        plain = add_norm(x, h, norm_a, norm_b, torch.bfloat16)
    assert counting.calls["add_rms_norm_rows"] == 2
    for gx, gy in (fused, plain):
        assert torch.equal(gx, want_x) and gy is not None and gy.dtype == torch.bfloat16
        assert torch.equal(gy.view(torch.int16), want_y.to(torch.bfloat16).view(torch.int16))
    # a norm of another kind, or autograd recording: the modules' own ops
    with torch.enable_grad():
        assert elementwise.add_rms_norm(x, h, norm_a.scale, None, EPS) is None
        assert elementwise.qk_norm_rope(qkv, heads, d, None, EPS, *tables) is None
