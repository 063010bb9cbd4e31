"""TorchAttention's decode rows against a brute-force float64 softmax attention over each
sequence's own keys: scattered cache slots, padded key counts of several lengths in one batch,
GQA, a sliding window, attention sinks, decode rows batched alone and beside a prefill."""
from __future__ import annotations

import math

import pytest
import torch

from mimo.gpu.attention import TorchAttention, build_attn_batch


def _reference(q, keys, vals, scale, sink=None):
    """q [Hq, D], keys [L, Hkv, D], vals [L, Hkv, Dv] -> [Hq, Dv], in float64."""
    Hq, Hkv = q.shape[0], keys.shape[1]
    out = []
    for h in range(Hq):
        g = h // (Hq // Hkv)
        s = (keys[:, g].double() @ q[h].double()) * scale                 # [L]
        if sink is not None:
            s = torch.cat([s, sink[h].double().view(1)])
        p = torch.softmax(s, 0)[:keys.shape[0]]
        out.append(p @ vals[:, g].double())
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("with_prefill", [False, True])
def test_decode_rows_match_brute_force(dtype, sinks, window, with_prefill):
    g = torch.Generator().manual_seed(7)
    Hq, Hkv, D, Dv, N = 4, 2, 32, 24, 2000
    kc = torch.randn(N, Hkv, D, generator=g).to(dtype)
    vc = torch.randn(N, Hkv, Dv, generator=g).to(dtype)
    perm = torch.randperm(N, generator=g)
    lens = [1, 17, 64, 65, 130]                  # positions of each decode row's new token
    base, owner = 0, {}
    for i, n in enumerate(lens):
        owner[i] = perm[base:base + n + 1]       # slots of positions [0, n]
        base += n + 1
    seqs = [(row, n, 1, i, 0, 0) for row, (i, n) in enumerate(enumerate(lens))]
    T = len(lens)
    if with_prefill:                             # a 9-token chunk at positions 3..11
        owner["p"] = perm[base:base + 12]
        seqs.append((T, 3, 9, "p", 0, 0))
        T += 9
    batch = build_attn_batch(seqs, window, lambda h, a, b: owner[h][a:b], "cpu", dtype)
    q = torch.randn(T, Hq, D, generator=g).to(dtype)
    k = torch.randn(T, Hkv, D, generator=g).to(dtype)
    v = torch.randn(T, Hkv, Dv, generator=g).to(dtype)
    sink = torch.randn(Hq, generator=g).to(dtype) if sinks else None
    scale = 1 / math.sqrt(D)
    out = TorchAttention().forward(q, k, v, kc, vc, batch, scale, sink)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for row, (i, n) in enumerate(enumerate(lens)):
        lo = 0 if window is None else max(0, n - window + 1)
        slots = owner[i][lo:n + 1]
        want = _reference(q[row], kc[slots], vc[slots], scale, sink)
        assert torch.allclose(out[row].double(), want, atol=tol, rtol=tol), (row, n)
    # The new tokens' K/V were written where each sequence's own slot map says.
    for row, (i, n) in enumerate(enumerate(lens)):
        assert torch.equal(kc[owner[i][n]], k[row])
