"""The C++ decode attention (CPUAttention, each kernel build this CPU runs) against a
brute-force float64 softmax attention over each query's own keys: scattered cache slots,
padded key counts of several lengths in one batch, GQA, key and value head dims that differ
(MiMo-V2-Flash's 192/128 shape, scaled down), a sliding window, attention sinks."""
from __future__ import annotations

import math

import pytest
import torch
from helpers.attention_reference import softmax_attention

from mimo.cpu import extension
from mimo.cpu.features import ISAS, cpu_info
from mimo.gpu.attention import build_attn_batch
from mimo.gpu.cpu_attention import CPUAttention


@pytest.mark.parametrize("isa", [i for i in ISAS if cpu_info().supports(i)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sinks", [False, True, "-inf"])
@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("dims", [(8, 2, 48, 32), (4, 4, 32, 32), (6, 1, 19, 13)])
def test_decode_matches_brute_force(isa, dtype, sinks, window, dims):
    """sinks "-inf": every other head's sink is minus infinity (it weighs nothing)."""
    ext = extension.load(isa)
    assert ext is not None
    g = torch.Generator().manual_seed(11)
    Hq, Hkv, D, Dv = dims
    N = 1500
    kc = torch.randn(N, Hkv, D, generator=g).to(dtype)
    vc = torch.randn(N, Hkv, Dv, generator=g).to(dtype)
    perm = torch.randperm(N, generator=g)
    lens = [0, 16, 63, 64, 200]                  # position of each row's new token
    owner, base = {}, 0
    for i, n in enumerate(lens):
        owner[i] = perm[base:base + n + 1]
        base += n + 1
    seqs = [(row, n, 1, row, 0, 0) for row, n in enumerate(lens)]
    batch = build_attn_batch(seqs, window, lambda h, a, b: owner[h][a:b], "cpu", dtype)
    assert batch.all_decode and batch.decode_mask is not None
    T = len(lens)
    q = torch.randn(T, Hq, D, generator=g).to(dtype)
    k = torch.randn(T, Hkv, D, generator=g).to(dtype)
    v = torch.randn(T, Hkv, Dv, generator=g).to(dtype)
    sink = (3 * torch.randn(Hq, generator=g)).to(dtype) if sinks else None
    if sinks == "-inf":
        sink[::2] = -math.inf
    scale = 1 / math.sqrt(D)
    out = CPUAttention(ext).forward(q, k, v, kc, vc, batch, scale, sink)
    assert out.dtype == dtype and out.shape == (T, Hq, Dv)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for row, n in enumerate(lens):
        lo = 0 if window is None else max(0, n - window + 1)
        slots = owner[row][lo:n + 1]
        assert torch.equal(kc[owner[row][n]], k[row])        # the new K/V were written first
        want = softmax_attention(q[row], kc[slots], vc[slots], scale, sink)
        torch.testing.assert_close(out[row].double(), want, atol=tol, rtol=tol)


def test_bad_inputs_are_refused():
    ext = extension.load()
    assert ext is not None
    q = torch.randn(1, 2, 8)
    kc, vc = torch.randn(10, 1, 8), torch.randn(10, 1, 8)
    slots = torch.tensor([[3, 11]])
    with pytest.raises(RuntimeError, match="slot out of range"):
        ext.paged_decode_attention(q, kc, vc, slots, torch.tensor([2]), 1.0, torch.empty(0))
    with pytest.raises(RuntimeError, match="multiple of KV heads"):
        ext.paged_decode_attention(torch.randn(1, 3, 8), torch.randn(10, 2, 8),
                                   torch.randn(10, 2, 8), slots, torch.tensor([1]), 1.0,
                                   torch.empty(0))
