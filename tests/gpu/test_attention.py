"""TorchAttention against a brute-force float64 softmax attention over each query's own keys:
scattered cache slots, decode rows with padded key counts of several lengths in one batch,
GQA, a sliding window, attention sinks, decode rows batched alone and beside a prefill chunk
long enough to go to SDPA in several query blocks, one of them starting above a key floor
(a window rebuild's), and chunks from a sequence's first position (the causal call)."""
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
    chunks = []                                  # (handle, first row, start, n, floor)
    if with_prefill:
        # A 300-token chunk at positions 50..349 (3 query blocks of PREFILL_QUERY_BLOCK),
        # a 20-token one at 30..49 whose keys start at a floor of 25, and two from their
        # sequences' first positions (plain causal; the longer one past the window of 40).
        for h, start, n, floor in (("p", 50, 300, 0), ("f", 30, 20, 25), ("z", 0, 35, 0),
                                   ("y", 0, 60, 0)):
            owner[h] = perm[base:base + start + n]
            base += start + n
            seqs.append((T, start, n, h, floor, 0))
            chunks.append((h, T, start, n, floor))
            T += n
    batch = build_attn_batch(seqs, window, lambda h, a, b: owner[h][a:b], "cpu", dtype)
    if with_prefill:
        assert [len(sp.blocks) for sp in batch.prefills] == [3, 1, 1, 1]
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
    for h, row0, start, n, floor in chunks:
        for j in range(n):
            p = start + j
            lo = max(0 if window is None else p - window + 1, min(floor, start))
            slots = owner[h][lo:p + 1]
            want = _reference(q[row0 + j], kc[slots], vc[slots], scale, sink)
            assert torch.allclose(out[row0 + j].double(), want, atol=tol, rtol=tol), (h, p)
    # The new tokens' K/V were written where each sequence's own slot map says.
    for row, (i, n) in enumerate(enumerate(lens)):
        assert torch.equal(kc[owner[i][n]], k[row])
