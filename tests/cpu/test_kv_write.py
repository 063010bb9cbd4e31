"""CPUAttention's cache write (csrc/kv_write.cpp's `write_rows`, each build this CPU runs)
against torch's index_copy_: K/V as strided views of a wider projection's rows (as the
attention layer hands them over), key and value head dims that differ, float32 and
bfloat16; every other slot untouched; a slot outside the cache refused before anything is
written; steps that write only some rows keep index_copy_."""
from __future__ import annotations

import pytest
import torch

from mimo.cpu import extension
from mimo.cpu.features import ISAS, cpu_info
from mimo.gpu.attention import AttnBatch, TorchAttention
from mimo.gpu.cpu_attention import CPUAttention

BUILDS = [i for i in ISAS if cpu_info().supports(i)]


class Counting:
    def __init__(self, ext):
        self.ext, self.calls = ext, 0

    def __getattr__(self, name):
        return getattr(self.ext, name)

    def write_rows(self, *args):
        self.calls += 1
        return self.ext.write_rows(*args)


def _step(T, Hkv, D, Dv, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    hq = 3
    qkv = torch.randn(T, (hq + Hkv) * D + Hkv * Dv, generator=g).to(dtype)
    k = qkv[:, hq * D:(hq + Hkv) * D].view(T, Hkv, D)       # strided rows, as in Attention
    v = qkv[:, (hq + Hkv) * D:].view(T, Hkv, Dv)
    S = 500
    kc = torch.randn(S, Hkv, D, generator=g).to(dtype)
    vc = torch.randn(S, Hkv, Dv, generator=g).to(dtype)
    slots = torch.randperm(S, generator=g)[:T]
    return k, v, kc, vc, slots


@pytest.mark.parametrize("isa", BUILDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dims", [(1, 256, 256), (2, 192, 128), (3, 6, 5)])
def test_write_matches_index_copy(isa, dtype, dims):
    Hkv, D, Dv = dims
    k, v, kc, vc, slots = _step(37, Hkv, D, Dv, dtype, D)
    batch = AttnBatch(slots, None, None, [])
    want_k, want_v = kc.clone(), vc.clone()
    TorchAttention.write(k, v, want_k, want_v, batch)
    counting = Counting(extension.load(isa))
    CPUAttention(counting).write(k, v, kc, vc, batch)
    assert counting.calls == 2
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


def test_partial_writes_keep_index_copy():
    k, v, kc, vc, slots = _step(10, 1, 16, 16, torch.bfloat16, 1)
    rows = torch.tensor([2, 3, 7])
    batch = AttnBatch(slots[:3], None, None, [], write_rows=rows)
    want_k, want_v = kc.clone(), vc.clone()
    TorchAttention.write(k, v, want_k, want_v, batch)
    counting = Counting(extension.load())
    CPUAttention(counting).write(k, v, kc, vc, batch)
    assert counting.calls == 0
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


def test_bad_writes_are_refused_and_write_nothing():
    ext = extension.load()
    k, v, kc, vc, slots = _step(8, 1, 16, 16, torch.float32, 2)
    before = kc.clone()
    bad = slots.clone()
    bad[5] = kc.shape[0]
    with pytest.raises(RuntimeError, match="out of the cache's"):
        ext.write_rows(kc, bad, k)
    bad[5] = -1
    with pytest.raises(RuntimeError, match="out of the cache's"):
        ext.write_rows(kc, bad, k)
    assert torch.equal(kc, before)
    with pytest.raises(RuntimeError, match="dtype"):
        ext.write_rows(kc, slots, k.bfloat16())
    with pytest.raises(RuntimeError, match="slots must be"):
        ext.write_rows(kc, slots[:4], k)
    with pytest.raises(RuntimeError, match="row shape"):
        ext.write_rows(kc, slots, k[:, :, :8])
    with pytest.raises(RuntimeError, match="rows must be contiguous"):
        ext.write_rows(kc, slots, torch.randn(8, 1, 32)[:, :, ::2])
