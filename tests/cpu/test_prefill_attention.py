"""Prefill attention through CPUAttention (mimo's AMX kernel and its bfloat16 dot-product
kernel where the build and CPU have them, torch's path elsewhere) against a brute-force
float64 softmax over each query's own keys: several prefill chunks and decode rows in one
batch, chunks that start mid-sequence, a sliding window, a key floor (a window rebuild),
rows whose K/V are already cached, GQA, key and value head dims that differ
(MiMo-V2-Flash's 192/128 shape), sinks."""
from __future__ import annotations

import math

import pytest
import torch
from helpers.attention_reference import softmax_attention

from mimo.cpu import extension
from mimo.cpu.features import ISAS, cpu_info
from mimo.gpu.attention import build_attn_batch
from mimo.gpu.cpu_attention import CPUAttention, prefill_path

BF16_KERNEL = "avx512_bf16" in cpu_info().flags
AMX = BF16_KERNEL and "amx_bf16" in cpu_info().flags


class Counting:
    """The extension, counting each prefill kernel's calls (which path a chunk took)."""

    def __init__(self, ext):
        self.ext, self.calls, self.amx_calls = ext, 0, 0

    def __getattr__(self, name):
        return getattr(self.ext, name)

    def prefill_attention(self, *args):
        self.calls += 1
        return self.ext.prefill_attention(*args)

    def prefill_attention_amx_spans(self, *args):
        self.amx_calls += 1
        return self.ext.prefill_attention_amx_spans(*args)


# (row count n, start position, key floor, write_from): chunks of one step
SPANS = [(37, 0, 0, 0), (150, 200, 0, 0), (70, 530, 450, 0), (1, 90, 0, 0), (90, 310, 0, 330),
         (60, 600, 0, 0),
         (1, 700, 0, 0), (5, 3, 0, 0)]


def run_case(ext, dims, window, sinks, seed=5, spans=SPANS, prefill="auto"):
    """Build one mixed step, run it, and compare every row with the reference; returns
    the CPUAttention used (its `prefill` says which path ran). `sinks`: False, True, or
    "-inf" (every other head's sink minus infinity)."""
    g = torch.Generator().manual_seed(seed)
    Hq, Hkv, D, Dv = dims
    dtype = torch.bfloat16
    N = max(4000, sum(start + n for n, start, _, _ in spans))
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
    if sinks == "-inf":
        sink[::2] = -math.inf       # a sink that weighs nothing, beside finite ones
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
@pytest.mark.parametrize("prefill", ["amx", "kernel", "torch"])
@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("window", [None, 40, 512])
@pytest.mark.parametrize("dims", [(4, 1, 256, 256), (8, 2, 192, 128), (6, 3, 64, 64)])
def test_prefill_matches_brute_force(isa, prefill, sinks, window, dims):
    """Each path forced: mimo's kernels (where the build and CPU have them) and torch's."""
    ext = extension.load(isa)
    assert ext is not None
    counting = Counting(ext)
    attn = run_case(counting, dims, window, sinks, prefill=prefill)
    # A kernel runs wherever it can: the avx512-vnni build on a CPU with AVX512-BF16 (and
    # AMX for the brgemm one); elsewhere the chunks take torch's path.
    vnni = isa == "avx512-vnni"
    runs = {"amx": vnni and AMX, "kernel": vnni and BF16_KERNEL, "torch": True}[prefill]
    assert attn.prefill == (prefill if runs else "torch")
    assert (counting.calls > 0) == (runs and prefill == "kernel")
    assert (counting.amx_calls > 0) == (runs and prefill == "amx")


# Longer chunks than SPANS': the brgemm kernel's tiles (32 positions at 4 query heads per KV
# head) are crossed many times, mid-sequence starts land off its 32-key column grid, a chunk
# is longer than the window, and without a window a tile's keys (up to 2,500) take three
# products of at most 1,024 keys each, its softmax carried from one to the next.
LONG_SPANS = [(700, 0, 0, 0), (300, 2200, 0, 0), (257, 515, 0, 0), (1, 900, 0, 0)]


@pytest.mark.parametrize("isa", [i for i in ISAS if cpu_info().supports(i)])
@pytest.mark.parametrize("prefill", ["amx", "kernel", "torch"])
@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("dims", [(4, 1, 256, 256), (8, 2, 192, 128)])
def test_a_sink_of_minus_infinity_weighs_nothing(isa, prefill, window, dims):
    """A sink's logit joins the softmax; at minus infinity it adds nothing (the reference's
    exp(-inf) = 0), though the kernels start each row's sum from the sink's weight."""
    ext = extension.load(isa)
    assert ext is not None
    run_case(Counting(ext), dims, window, "-inf", prefill=prefill)


@pytest.mark.skipif(not AMX, reason="the brgemm kernel runs on AMX CPUs only (this has none)")
@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("window", [None, 512, 100])
def test_amx_long_chunks_match_brute_force(sinks, window):
    counting = Counting(extension.load("avx512-vnni"))
    attn = run_case(counting, (4, 1, 256, 256), window, sinks, seed=11, spans=LONG_SPANS,
                    prefill="amx")
    assert attn.prefill == "amx" and counting.amx_calls == 1     # every span in one call


@pytest.mark.parametrize("isa", [i for i in ISAS if cpu_info().supports(i)])
def test_bf16_decode_rows_take_the_fused_layers_kernel(isa, monkeypatch):
    """A mixed step's decode rows (bf16) run decode_ops.decode_attention with the weights
    rounded as the bf16 layer rounds them, and still match the float64 softmax."""
    from mimo.cpu import decode_ops
    from mimo.gpu import cpu_attention
    ext = extension.load(isa)
    real = decode_ops.load(isa)
    assert ext is not None and real is not None
    calls: list[bool] = []

    class Counting:
        def __getattr__(self, name):
            return getattr(real, name)

        def decode_attention(self, *args):
            calls.append(args[-1])
            return real.decode_attention(*args)
    monkeypatch.setattr(cpu_attention.decode_ops, "load", lambda isa=None: Counting())
    attn = run_case(ext, (4, 1, 256, 256), 64, True)
    # Where a prefill kernel runs (else the whole mixed step is torch's), rounded.
    assert (bool(calls) and all(calls)) == (attn.prefill != "torch")


def test_auto_picks_by_cpu():
    """'auto': the brgemm kernel on AMX, the dot-product kernel with AVX512-BF16 alone,
    torch's path without kernels."""

    class Ext:
        def __init__(self, amx, bf16):
            self.prefill_attention_amx_ok = lambda: amx
            self.prefill_attention_ok = lambda: bf16

    amx_cpu = frozenset({"avx512_bf16", "amx_bf16"})
    assert prefill_path("auto", Ext(True, True), amx_cpu) == "amx"
    assert prefill_path("auto", Ext(True, True), frozenset({"avx512_bf16"})) == "kernel"
    assert prefill_path("auto", Ext(False, True), amx_cpu) == "kernel"
    assert prefill_path("auto", Ext(False, False), amx_cpu) == "torch"
    assert prefill_path("auto", None, amx_cpu) == "torch"
    assert prefill_path("amx", Ext(False, True), amx_cpu) == "torch"
    ext = extension.load()
    assert ext is not None
    counting = Counting(ext)
    attn = run_case(counting, (4, 1, 256, 256), 40, False, spans=SPANS[:3])
    assert attn.prefill == ("amx" if AMX else "kernel" if BF16_KERNEL and ext.isa() ==
                            "avx512-vnni" else "torch")
    assert (counting.amx_calls > 0) == (attn.prefill == "amx")
    assert (counting.calls > 0) == (attn.prefill == "kernel")


def test_unknown_prefill_choice_is_refused():
    with pytest.raises(ValueError, match="prefill must be one of"):
        CPUAttention(extension.load(), "fast")


def test_odd_value_dims_take_the_torch_path():
    ext = extension.load()
    assert ext is not None
    attn = run_case(ext, (4, 2, 32, 40), 40, True, spans=SPANS[:3])
    assert attn.prefill != "torch" or not BF16_KERNEL
    assert not attn._prefill_fits(torch.empty(1, 4, 32, dtype=torch.bfloat16),
                                  torch.empty(1, 2, 32, dtype=torch.bfloat16),
                                  torch.empty(1, 2, 40, dtype=torch.bfloat16))


@pytest.mark.parametrize("isa", [i for i in ISAS if cpu_info().supports(i)])
@pytest.mark.parametrize("kernel", ["prefill_attention", "prefill_attention_amx"])
def test_bad_inputs_are_refused(isa, kernel):
    ext = extension.load(isa)
    assert ext is not None
    run, ok = getattr(ext, kernel), getattr(ext, kernel + "_ok")()
    bf = torch.bfloat16
    q = torch.randn(4, 2, 64).to(bf)
    kc, vc = torch.randn(10, 1, 64).to(bf), torch.randn(10, 1, 64).to(bf)
    none = torch.empty(0)
    if not ok:       # the AVX2 build, or a CPU without AVX512-BF16 (or AMX)
        with pytest.raises(RuntimeError, match="avx512-vnni build only|AVX512-BF16"):
            run(q, kc, vc, torch.arange(4), 0, 0, 1.0, none)
        return
    with pytest.raises(RuntimeError, match="slot out of range"):
        run(q, kc, vc, torch.tensor([1, 2, 3, 10]), 0, 0, 1.0, none)
    with pytest.raises(RuntimeError, match="bfloat16"):
        run(q.float(), kc, vc, torch.arange(4), 0, 0, 1.0, none)
    with pytest.raises(RuntimeError, match="within the keys"):
        run(q, kc, vc, torch.arange(4), 1, 0, 1.0, none)
    with pytest.raises(RuntimeError, match="sinks"):
        run(q, kc, vc, torch.arange(4), 0, 0, 1.0, torch.zeros(3))
    with pytest.raises(RuntimeError, match="multiple of KV heads"):
        run(torch.randn(4, 3, 64).to(bf), torch.randn(10, 2, 64).to(bf),
            torch.randn(10, 2, 64).to(bf), torch.arange(4), 0, 0, 1.0, none)
    for bad in (torch.empty(4, 2, 32, dtype=bf), torch.empty(4, 2, 64, dtype=torch.float16),
                torch.empty(4, 4, 64, dtype=bf)[:, ::2]):
        with pytest.raises(RuntimeError, match="out must be"):
            run(q, kc, vc, torch.arange(4), 0, 0, 1.0, none, bad)


@pytest.mark.parametrize("isa", [i for i in ISAS if cpu_info().supports(i)])
@pytest.mark.parametrize("kernel", ["prefill_attention", "prefill_attention_amx"])
@pytest.mark.parametrize("window", [0, 40])
def test_the_kernels_write_bf16_rows_in_place(isa, kernel, window):
    """`out`: a bfloat16 slice of a step's output gets exactly the float32 result rounded
    as torch rounds it, and no row outside the slice changes."""
    ext = extension.load(isa)
    assert ext is not None
    g = torch.Generator().manual_seed(3)
    bf = torch.bfloat16
    n, L, Hq, Hkv, D = 150, 400, 4, 1, 128
    q = torch.randn(n, Hq, D, generator=g).to(bf)
    kc, vc = (torch.randn(L, Hkv, D, generator=g).to(bf) for _ in range(2))
    slots = torch.randperm(L, generator=g)
    sinks = torch.randn(Hq, generator=g)
    run = getattr(ext, kernel)
    if not getattr(ext, kernel + "_ok")():      # not in this build, or not on this CPU
        with pytest.raises(RuntimeError, match="avx512-vnni build only|AVX512-BF16"):
            run(q, kc, vc, slots, L - n, window, 0.1, sinks, torch.empty(n, Hq, D, dtype=bf))
        return
    want = run(q, kc, vc, slots, L - n, window, 0.1, sinks)
    assert want.dtype == torch.float32
    step = torch.full((n + 30, Hq, D), 7.0, dtype=bf)
    got = run(q, kc, vc, slots, L - n, window, 0.1, sinks, step[10:10 + n])
    assert got.data_ptr() == step[10].data_ptr()
    assert torch.equal(step[10:10 + n].view(torch.int16), want.to(bf).view(torch.int16))
    assert (step[:10] == 7).all() and (step[10 + n:] == 7).all()
    f32 = torch.empty(n, Hq, D)
    run(q, kc, vc, slots, L - n, window, 0.1, sinks, f32)
    assert torch.equal(f32, want)


@pytest.mark.skipif(not AMX, reason="the brgemm kernel runs on AMX CPUs only (this has none)")
@pytest.mark.parametrize("window", [0, 40])
@pytest.mark.parametrize("sinks", [False, True])
def test_the_spans_call_equals_a_call_per_span(window, sinks):
    """`prefill_attention_amx_spans` (a step's spans in one call, rows of `out` in place)
    gives each span's rows exactly what a call of its own gives, in any row order, and
    leaves the rows no span names as they were (a step's decode rows)."""
    ext = extension.load("avx512-vnni")
    g = torch.Generator().manual_seed(7)
    bf = torch.bfloat16
    Hq, Hkv, D = 8, 2, 64
    kc, vc = (torch.randn(3000, Hkv, D, generator=g).to(bf) for _ in range(2))
    # (n, L): a fresh prompt, chunks mid-sequence, a one-row span, an empty one
    shapes = [(150, 150), (37, 400), (1, 90), (64, 700), (0, 30), (200, 260)]
    order = [3, 0, 5, 1, 4, 2]                  # rows in the step in another order
    rows, r = {}, 3                             # rows 0-2 and a gap: "decode rows"
    for i in order:
        rows[i] = r
        r += shapes[i][0] + (2 if i == 1 else 0)
    T = r + 1
    q = torch.randn(T, Hq, D, generator=g).to(bf)
    perm = torch.randperm(3000, generator=g)
    slots, table, s0 = [], [], 0
    for i, (n, L) in enumerate(shapes):
        sl = perm[s0:s0 + L]
        slots.append(sl)
        table.append((rows[i], n, s0, L, L - n))
        s0 += L
    sk = torch.randn(Hq, generator=g) if sinks else torch.empty(0)
    out = torch.full((T, Hq, D), 7.0, dtype=bf)
    ext.prefill_attention_amx_spans(q, kc, vc, torch.cat(slots), torch.tensor(table), window,
                                    0.125, sk, out)
    covered = torch.zeros(T, dtype=torch.bool)
    for i, (n, L) in enumerate(shapes):
        r0 = rows[i]
        covered[r0:r0 + n] = True
        if n == 0:
            continue
        want = ext.prefill_attention_amx(q[r0:r0 + n].contiguous(), kc, vc, slots[i], L - n,
                                         window, 0.125, sk)
        assert torch.equal(out[r0:r0 + n].view(torch.int16), want.to(bf).view(torch.int16)), i
    assert (out[~covered] == 7).all()
    f32 = torch.zeros(T, Hq, D)
    ext.prefill_attention_amx_spans(q, kc, vc, torch.cat(slots), torch.tensor(table), window,
                                    0.125, sk, f32)
    assert torch.equal(f32[covered].to(bf), out[covered]) and (f32[~covered] == 0).all()


@pytest.mark.skipif(not AMX, reason="the brgemm kernel runs on AMX CPUs only (this has none)")
def test_the_spans_call_refuses_bad_tables():
    ext = extension.load("avx512-vnni")
    bf = torch.bfloat16
    q, out = torch.randn(10, 2, 64).to(bf), torch.empty(10, 2, 64, dtype=bf)
    kc, vc = torch.randn(20, 1, 64).to(bf), torch.randn(20, 1, 64).to(bf)
    slots, none = torch.arange(12), torch.empty(0)

    def run(table, o=out, s=slots):
        ext.prefill_attention_amx_spans(q, kc, vc, s, torch.tensor(table), 0, 1.0, none, o)
    run([(0, 4, 0, 4, 0), (4, 6, 4, 8, 2)])                     # fine
    with pytest.raises(RuntimeError, match=r"\[S, 5\]"):
        run([(0, 4, 0, 4)])
    with pytest.raises(RuntimeError, match="outside q"):
        run([(8, 4, 0, 4, 0)])
    with pytest.raises(RuntimeError, match="outside the 12 given"):
        run([(0, 4, 10, 4, 0)])
    with pytest.raises(RuntimeError, match="within the keys"):
        run([(0, 4, 0, 4, 1)])
    with pytest.raises(RuntimeError, match="slot out of range"):
        run([(0, 4, 0, 4, 0)], s=torch.tensor([0, 1, 2, 99]))
    with pytest.raises(RuntimeError, match="out must be"):
        run([(0, 4, 0, 4, 0)], o=torch.empty(10, 2, 64, dtype=torch.float16))
