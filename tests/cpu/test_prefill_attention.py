"""Prefill attention through CPUAttention (the bfloat16 flash kernel where the build and
CPU have it, torch's path elsewhere) against a brute-force float64 softmax over each
query's own keys: several prefill chunks and decode rows in one batch, chunks that start
mid-sequence, a sliding window, a key floor (a window rebuild), rows whose K/V are already
cached, GQA, key and value head dims that differ (MiMo-V2-Flash's 192/128 shape), sinks."""
from __future__ import annotations

import math

import pytest
import torch
from helpers.attention_reference import softmax_attention

from mimo.cpu import extension
from mimo.cpu.features import ISAS, cpu_info
from mimo.gpu.attention import build_attn_batch
from mimo.gpu.cpu_attention import CPUAttention, torch_flash_first

BF16_KERNEL = "avx512_bf16" in cpu_info().flags


class Counting:
    """The extension, counting the prefill kernel's calls (which path a chunk took)."""

    def __init__(self, ext):
        self.ext, self.calls = ext, 0

    def __getattr__(self, name):
        return getattr(self.ext, name)

    def prefill_attention(self, *args):
        self.calls += 1
        return self.ext.prefill_attention(*args)


# (row count n, start position, key floor, write_from): chunks of one step
SPANS = [(37, 0, 0, 0), (150, 200, 0, 0), (70, 530, 450, 0), (1, 90, 0, 0), (90, 310, 0, 330),
         (60, 600, 0, 0),
         (1, 700, 0, 0), (5, 3, 0, 0)]


def run_case(ext, dims, window, sinks, seed=5, spans=SPANS, prefill="auto"):
    """Build one mixed step, run it, and compare every row with the reference; returns
    the CPUAttention used (its `prefill_kernel` says which path ran)."""
    g = torch.Generator().manual_seed(seed)
    Hq, Hkv, D, Dv = dims
    dtype = torch.bfloat16
    N = 4000
    kc = torch.randn(N, Hkv, D, generator=g).to(dtype)
    vc = torch.randn(N, Hkv, Dv, generator=g).to(dtype)
    perm = torch.randperm(N, generator=g)
    owner, seqs, row, base = {}, [], 0, 0
    for i, (n, start, floor, wfrom) in enumerate(spans):
        owner[i] = perm[base:base + start + n]
        base += start + n
        seqs.append((row, start, n, i, floor, wfrom))
        row += n
    batch = build_attn_batch(seqs, window, lambda h, a, b: owner[h][a:b], "cpu", dtype)
    q = torch.randn(row, Hq, D, generator=g).to(dtype)
    k = torch.randn(row, Hkv, D, generator=g).to(dtype)
    v = torch.randn(row, Hkv, Dv, generator=g).to(dtype)
    for i, (n, start, _, _) in enumerate(spans):     # cached rows hold these K/V
        r0 = seqs[i][0]
        kc[owner[i][start:start + n]] = k[r0:r0 + n]
        vc[owner[i][start:start + n]] = v[r0:r0 + n]
    sink = (3 * torch.randn(Hq, generator=g)).to(dtype) if sinks else None
    scale = 1 / math.sqrt(D)
    attn = CPUAttention(ext, prefill)
    out = attn.forward(q, k, v, kc, vc, batch, scale, sink)
    assert out.dtype == dtype and out.shape == (row, Hq, Dv)
    for i, (n, start, floor, _) in enumerate(spans):
        for t in range(n):
            p = start + t
            lo = 0 if window is None else max(0, p - window + 1)
            lo = max(lo, min(floor, start))
            slots = owner[i][lo:p + 1]
            want = softmax_attention(q[seqs[i][0] + t], kc[slots], vc[slots], scale, sink)
            torch.testing.assert_close(out[seqs[i][0] + t].double(), want, atol=2e-2, rtol=2e-2,
                                       msg=lambda m, i=i, t=t: f"span {i} query {t}: {m}")
    return attn


@pytest.mark.parametrize("isa", [i for i in ISAS if cpu_info().supports(i)])
@pytest.mark.parametrize("prefill", ["kernel", "torch"])
@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("window", [None, 40, 512])
@pytest.mark.parametrize("dims", [(4, 1, 256, 256), (8, 2, 192, 128), (6, 3, 64, 64)])
def test_prefill_matches_brute_force(isa, prefill, sinks, window, dims):
    """Each path forced: mimo's kernel (where the build and CPU have it) and torch's."""
    ext = extension.load(isa)
    assert ext is not None
    counting = Counting(ext)
    attn = run_case(counting, dims, window, sinks, prefill=prefill)
    # The kernel runs wherever it can: the avx512-vnni build on a CPU with AVX512-BF16.
    assert attn.prefill_kernel == (isa == "avx512-vnni" and BF16_KERNEL)
    assert (counting.calls > 0) == (attn.prefill_kernel and prefill == "kernel")


@pytest.mark.parametrize("sinks", [False, True])
def test_auto_takes_torch_flash_on_amx_only_without_sinks(sinks):
    """'auto': torch's flash kernel (oneDNN's AMX tiles) for chunks without sinks on a CPU
    with AMX, mimo's kernel for the rest where it runs."""
    assert torch_flash_first(frozenset({"avx512_bf16", "amx_bf16"}))
    assert not torch_flash_first(frozenset({"avx512_bf16", "avx512_vnni"}))
    ext = extension.load()
    assert ext is not None
    counting = Counting(ext)
    attn = run_case(counting, (4, 1, 256, 256), 40, sinks, spans=SPANS[:3])
    kernel = attn.prefill_kernel and (sinks or not torch_flash_first(cpu_info().flags))
    assert (counting.calls > 0) == kernel


def test_unknown_prefill_choice_is_refused():
    with pytest.raises(ValueError, match="prefill must be one of"):
        CPUAttention(extension.load(), "fast")


def test_odd_value_dims_take_the_torch_path():
    ext = extension.load()
    assert ext is not None
    attn = run_case(ext, (4, 2, 32, 40), 40, True, spans=SPANS[:3])
    assert not attn._prefill_fits(torch.empty(1, 4, 32, dtype=torch.bfloat16),
                                  torch.empty(1, 2, 32, dtype=torch.bfloat16),
                                  torch.empty(1, 2, 40, dtype=torch.bfloat16))


@pytest.mark.parametrize("isa", [i for i in ISAS if cpu_info().supports(i)])
def test_bad_inputs_are_refused(isa):
    ext = extension.load(isa)
    assert ext is not None
    bf = torch.bfloat16
    q = torch.randn(4, 2, 64).to(bf)
    kc, vc = torch.randn(10, 1, 64).to(bf), torch.randn(10, 1, 64).to(bf)
    none = torch.empty(0)
    if not ext.prefill_attention_ok():       # the AVX2 build, or a CPU without AVX512-BF16
        with pytest.raises(RuntimeError, match="avx512-vnni build only|AVX512-BF16"):
            ext.prefill_attention(q, kc, vc, torch.arange(4), 0, 0, 1.0, none)
        return
    with pytest.raises(RuntimeError, match="slot out of range"):
        ext.prefill_attention(q, kc, vc, torch.tensor([1, 2, 3, 10]), 0, 0, 1.0, none)
    with pytest.raises(RuntimeError, match="bfloat16"):
        ext.prefill_attention(q.float(), kc, vc, torch.arange(4), 0, 0, 1.0, none)
    with pytest.raises(RuntimeError, match="within the keys"):
        ext.prefill_attention(q, kc, vc, torch.arange(4), 1, 0, 1.0, none)
    with pytest.raises(RuntimeError, match="sinks"):
        ext.prefill_attention(q, kc, vc, torch.arange(4), 0, 0, 1.0, torch.zeros(3))
    with pytest.raises(RuntimeError, match="multiple of KV heads"):
        ext.prefill_attention(torch.randn(4, 3, 64).to(bf), torch.randn(10, 2, 64).to(bf),
                              torch.randn(10, 2, 64).to(bf), torch.arange(4), 0, 0, 1.0, none)
