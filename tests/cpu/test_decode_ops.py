"""The fused decode layer (mimo/cpu/csrc/decode_layer.cpp), on each kernel build this CPU runs:
its elementwise ops against plain float64 math (odd sizes, bfloat16 rounding), one whole
layer against the plain PyTorch layer on the same weights, caches and batch, and greedy
tokens through the fused and the plain layers of tiny models."""
from __future__ import annotations

import math

import pytest
import torch
from helpers.attention_reference import softmax_attention
from helpers.kernel_builds import kernel_build, kernel_builds

from mimo.cpu import decode_ops
from mimo.gpu.attention import TorchAttention, build_attn_batch
from mimo.models import fused_decode

BUILDS = kernel_builds()


@pytest.fixture(params=BUILDS)
def ops(request):
    """The decode ops of each build (the AMX tiles as one: the fused layers' products)."""
    isa = request.param.partition("+")[0]
    with kernel_build(request.param):
        mod = decode_ops.load(isa)
        assert mod is not None, f"the {isa} build failed on a CPU that supports it"
        assert isa.replace("-", "_") in mod.__name__
        yield mod


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.float().to(torch.bfloat16).double()


def _close_bf16(got: torch.Tensor, want: torch.Tensor) -> None:
    """Rounded results: equal to the float64 value rounded, or one bf16 step off where the
    float64 value lies within float32 noise of a rounding boundary."""
    step = want.abs().clamp(min=1e-30) * 2.0 ** -7
    assert ((got.double() - want).abs() <= step).all()
    assert (got.double() == _bf16(want)).float().mean() > 0.99


@pytest.mark.parametrize("rows,n", [(1, 640), (3, 37), (10, 256)])
def test_rms_norm_matches_float64(ops, rows, n):
    g = torch.Generator().manual_seed(rows * n)
    x = torch.randn(rows, n, generator=g) * 3
    scale = 1 + 0.5 * torch.randn(n, generator=g)
    eps = 1e-6
    ref = x.double() / torch.sqrt((x.double() ** 2).mean(1, keepdim=True) + eps) * scale.double()
    got = ops.rms_norm(x, scale, eps, False)
    torch.testing.assert_close(got.double(), ref, rtol=2e-6, atol=1e-6)
    _close_bf16(ops.rms_norm(x, scale, eps, True), ref)
    # a [heads, n] scale applies per head to rows of stacked heads (the q/k norms)
    heads = torch.randn(rows, n, generator=g)
    got = ops.rms_norm(x.repeat(2, 1), heads, eps, False)
    ref2 = torch.cat([ref / scale.double() * heads.double()] * 2)
    torch.testing.assert_close(got.double(), ref2, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("act", ["gelu_tanh", "silu"])
@pytest.mark.parametrize("T,inter", [(1, 2048), (3, 13), (5, 100)])
def test_act_and_mul_matches_float64(ops, act, T, inter):
    I = inter  # noqa: E741  (the intermediate size, as in the C++)
    g = torch.Generator().manual_seed(T * I)
    gu = torch.randn(T, 2 * I, generator=g) * 4
    gu[0, :3] = torch.tensor([-30.0, 30.0, 0.0])        # saturated tails, zero
    gate, up = gu.double()[:, :I], gu.double()[:, I:]
    if act == "gelu_tanh":
        a = 0.5 * gate * (1 + torch.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate ** 3)))
    else:
        a = gate / (1 + torch.exp(-gate))
    # float32 bound: torch's formula cancels in 1 + tanh, an absolute error of ~1e-7 x |g u|
    got = ops.act_and_mul(gu, act, False).double()
    assert ((got - a * up).abs() <= 3e-6 * (a * up).abs() + 2e-7 * (gate * up).abs()).all()
    # rounded twice, as torch's bfloat16 ops round: act(g), then its product with u
    gb = gu.to(torch.bfloat16).float()
    got = ops.act_and_mul(gb, act, True).double()
    gate, up = gb.double()[:, :I], gb.double()[:, I:]
    if act == "gelu_tanh":
        a = 0.5 * gate * (1 + torch.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate ** 3)))
    else:
        a = gate / (1 + torch.exp(-gate))
    want = _bf16(_bf16(a) * up)
    # two roundings, each possibly a step off; plus the float32 cancellation above
    assert ((got - want).abs() <= want.abs() * 2.0 ** -6 + 1e-7 * (gate * up).abs()).all()
    body = gate > -3            # outside the tail where float32 cancels: the same bf16 value
    assert (got == want)[body].float().mean() > 0.97


@pytest.mark.parametrize("T,heads,d", [(1, 5, 256), (3, 2, 18), (4, 3, 2)])
def test_rope_matches_float64(ops, T, heads, d):
    g = torch.Generator().manual_seed(T * heads * d)
    x = torch.randn(T, heads, d, generator=g)
    ang = torch.rand(T, d // 2, generator=g, dtype=torch.float64) * 20
    cos = torch.cat([ang.cos(), ang.cos()], 1)
    sin = torch.cat([-ang.sin(), ang.sin()], 1)             # the sign of rotate-half folded in
    h = d // 2
    xd = x.double()
    ref = torch.cat([xd[..., :h] * ang.cos()[:, None] - xd[..., h:] * ang.sin()[:, None],
                     xd[..., h:] * ang.cos()[:, None] + xd[..., :h] * ang.sin()[:, None]], -1)
    got = ops.rope(x, cos.float(), sin.float(), False)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
    # rounded as the plain bfloat16 layer rounds: each product and the sum, by torch's casts
    def b(t):
        return t.bfloat16().float()
    c, s = cos.float()[:, None], sin.float()[:, None]
    lo, hi = x[..., :h], x[..., h:]
    want = torch.cat([b(b(lo * c[..., :h]) + b(hi * s[..., :h])),
                      b(b(hi * c[..., h:]) + b(lo * s[..., h:]))], -1)
    assert torch.equal(ops.rope(x, cos.float(), sin.float(), True), want)


def _tiny_engine(dtype: str, fused: str, **overrides):
    from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

    from mimo import LLM
    return LLM("tiny", loaded=loaded_from_hf(tiny_gemma3_hf(seed=5, **overrides)), dtype=dtype,
               quantize="q8_0", fused_decode=fused, kv_cache_memory="4MiB", progress=False)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_fused_layer_equals_the_plain_layer(ops, dtype):
    """Layer by layer, decode rows of several sequences (scattered, padded key lists): the
    fused layer's output and the K/V it writes equal the plain layer's, within the float32
    sums' reordering (float32), or within 3% of the layer's update (bfloat16)."""
    llm = _tiny_engine(dtype, "off")
    model = llm.engine.model
    assert model.fuse_decode(ops) == len(model.layers)
    g = torch.Generator().manual_seed(3)
    hid, lens = model.cfg.hidden_size, [0, 5, 17, 40]      # each row's position
    N = 400
    perm = torch.randperm(N, generator=g)
    owner = {i: perm[sum(lens[:i]) + i: sum(lens[:i + 1]) + i + 1] for i in range(len(lens))}
    positions = torch.tensor(lens)
    for i, layer in enumerate(model.layers):
        kc0, vc0 = (t for t in llm.engine.runner.kv[i])
        kc0 = torch.randn(N, *kc0.shape[1:], generator=g).to(kc0.dtype)
        vc0 = torch.randn(N, *vc0.shape[1:], generator=g).to(vc0.dtype)
        window = model.cfg.sliding_window if layer.kind == "swa" else None
        batch = build_attn_batch([(r, n, 1, r, 0, 0) for r, n in enumerate(lens)], window,
                                 lambda h, a, b: owner[h][a:b], "cpu", kc0.dtype)
        x = torch.randn(len(lens), hid, generator=g) * 2
        tables = model.rope[layer.kind].tables(positions)
        kc, vc = kc0.clone(), vc0.clone()
        want = layer(x, tables, kc, vc, batch, TorchAttention())
        kf, vf = kc0.clone(), vc0.clone()
        got = fused_decode.run(model._fused[i], x, tables, kf, vf, batch)
        if dtype == "float32":
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(kf, kc, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(vf, vc, rtol=1e-5, atol=1e-5)
        else:
            # the attention's bf16 output differs by a rounding step here and there (float32
            # sums in another order), and the int8 activations of the products after it turn
            # some of those into whole quantization steps (1/127 of a block's largest value)
            assert (got - want).norm() < 0.03 * (want - x).norm()
            assert (kf != kc).float().mean() < 0.01 and (vf == vc).all()


def _greedy(llm, prompts, n=12):
    from mimo import SamplingParams
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    return [o.token_ids for o in outs]


def _agree(llm, ref_llm, prompts, tie, n=24) -> int:
    """Greedy tokens of `llm` equal `ref_llm`'s up to the first step where the reference's
    top-2 margin is at most `tie` (a near-tie that float32 summation order may decide);
    returns how many steps were compared. The margin is read from float32 log-probabilities
    of bfloat16 logits, so "two bf16 steps" arrives as 0.25000006: `tie` is compared with
    a float32 rounding's slack."""
    from mimo import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=2)
    compared = 0
    for got, ref in zip(llm.generate(prompts, params), ref_llm.generate(prompts, params)):
        for step, lp in enumerate(ref.logprobs):
            if lp.top[0][1] - lp.top[1][1] <= tie + 1e-4:
                break
            assert got.token_ids[step] == ref.token_ids[step], (ref.prompt_token_ids, step)
            compared += 1
    return compared


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_gemma3_greedy_tokens_fused_equal_plain(dtype, monkeypatch):
    from helpers.tiny_models import random_prompts
    prompts = [{"prompt_token_ids": p} for p in random_prompts(7, [3, 11, 30])]
    plain = _greedy(_tiny_engine(dtype, "off"), prompts)
    llm = _tiny_engine(dtype, "auto")
    assert llm.engine.weights.fused_layers == 6
    calls = []
    real = fused_decode.run
    monkeypatch.setattr(fused_decode, "run", lambda *a: calls.append(1) or real(*a))
    assert _greedy(llm, prompts) == plain          # batched decode rows
    assert [_greedy(llm, [p])[0] for p in prompts] == plain     # one row at a time
    assert len(calls) > 0


def test_more_query_heads_per_kv_head_than_the_kernel_takes_stay_plain(ops):
    """32 query heads on one KV head (the decode attention takes at most `max_rep`): no
    layer is fused, and decoding runs the plain layers, as with fusing off."""
    from helpers.tiny_models import random_prompts
    assert ops.max_rep < 32
    wide = dict(num_attention_heads=32, num_key_value_heads=1, head_dim=8)
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, [5, 19])]
    llm = _tiny_engine("float32", "auto", **wide)
    assert llm.engine.weights.fused_layers == 0
    assert _greedy(llm, prompts) == _greedy(_tiny_engine("float32", "off", **wide), prompts)


def test_a_step_without_rows_is_refused(ops):
    """Zero rows: a clear error, not a crash (a division by the row count once killed the
    process), and the caches untouched."""
    llm = _tiny_engine("float32", "off")
    model = llm.engine.model
    assert model.fuse_decode(ops) == len(model.layers)
    kc, vc = (torch.zeros(64, *t.shape[1:]) for t in llm.engine.runner.kv[0])
    none = torch.zeros(0, dtype=torch.int64)
    x = torch.zeros(0, model.cfg.hidden_size)
    cos, sin = model.rope[model.layers[0].kind].tables(none)
    with pytest.raises(RuntimeError, match="at least one row"):
        model._fused[0].forward(x, cos.float(), sin.float(), kc, vc, none,
                                none.view(0, 1), none)
    assert not kc.any() and not vc.any()


def test_steps_the_fused_layers_do_not_run():
    """Prefill rows, rows whose K/V are not written, and paged backends take the plain path."""
    x = torch.zeros(2, 8)
    slots = torch.arange(10)
    dec = build_attn_batch([(0, 4, 1, 0, 0, 0), (1, 6, 1, 0, 0, 0)], None,
                           lambda h, a, b: slots[a:b], "cpu", torch.float32)
    assert fused_decode.step_fits(x, {"full": dec}, TorchAttention())
    pre = build_attn_batch([(0, 0, 2, 0, 0, 0)], None, lambda h, a, b: slots[a:b], "cpu",
                           torch.float32)
    assert not fused_decode.step_fits(x, {"full": dec, "swa": pre}, TorchAttention())
    dec.write_rows = torch.tensor([1])
    assert not fused_decode.step_fits(x, {"full": dec}, TorchAttention())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_mimo_v2_flash_fuses_its_dense_layer_only(dtype):
    """MiMo-V2-Flash's dense first layer (partial RoPE, value scale, q/k head dim 24 and v 16)
    runs fused; its MoE layers stay plain; greedy tokens equal the plain run's."""
    from helpers.tiny_models import loaded_from_hf, random_prompts, tiny_mimo_v2_flash_hf

    from mimo import LLM

    def engine(fused):
        # prefill on the dense weights in both runs: the fused and the plain decode steps are
        # compared from the KV this test was written against (under the blocks' prefill GEMM
        # they parted in bf16 at a step whose plain top-2 margin was 0.06, four bf16 steps)
        return LLM("tiny", loaded=loaded_from_hf(tiny_mimo_v2_flash_hf(seed=2)), dtype=dtype,
                   quantize="q8_0", fused_decode=fused, prefill_matmul="dense",
                   kv_cache_memory="4MiB", progress=False)
    prompts = [{"prompt_token_ids": p} for p in random_prompts(9, [4, 19, 9], vocab=300)]
    llm = engine("auto")
    assert llm.engine.weights.fused_layers == 1
    if dtype == "float32":
        assert _greedy(llm, prompts) == _greedy(engine("off"), prompts)
    else:       # random weights: bf16 near-ties come early
        assert _agree(llm, engine("off"), prompts, 0.05) >= 8


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("dims,lens", [((4, 1, 256, 256), [300]), ((4, 1, 32, 32), [0, 7, 31, 90]),
                                       ((8, 2, 24, 16), [5, 64, 200]), ((6, 3, 19, 13), [1, 33])])
def test_decode_attention_matches_float64(ops, cache_dtype, sinks, dims, lens):
    """By KV head, split along the keys (one sequence of one KV head runs in parts)."""
    Hq, Hkv, D, Dv = dims
    g = torch.Generator().manual_seed(sum(lens) + D)
    N = sum(lens) + 50
    kc = torch.randn(N, Hkv, D, generator=g).to(cache_dtype)
    vc = torch.randn(N, Hkv, Dv, generator=g).to(cache_dtype)
    perm = torch.randperm(N, generator=g)
    L = max(max(lens), 1)
    slots = torch.zeros(len(lens), L, dtype=torch.int64)
    base = 0
    for b, n in enumerate(lens):
        slots[b, :n] = perm[base:base + n]
        base += n
    q = torch.randn(len(lens), Hq, D, generator=g)
    sink = 2 * torch.randn(Hq, generator=g) if sinks else None
    scale = D ** -0.5
    args = (q, kc, vc, slots, torch.tensor(lens), scale, torch.empty(0) if sink is None else sink)
    got, rounded = ops.decode_attention(*args, False), ops.decode_attention(*args, True)
    for b, n in enumerate(lens):
        if n == 0 and sink is None:
            assert (got[b] == 0).all() and (rounded[b] == 0).all()
            continue
        want = softmax_attention(q[b], kc[slots[b, :n]], vc[slots[b, :n]], scale, sink)
        torch.testing.assert_close(got[b].double(), want, rtol=1e-4, atol=1e-5)
        # weights rounded to bfloat16 (relative error 2^-9 each) before the values
        torch.testing.assert_close(rounded[b].double(), want, rtol=0, atol=2e-2)


def test_default_model_greedy_tokens_fused_equal_plain(gemma_loaded):
    """Gemma 3 270M from its GGUF (the default runtime: bf16, the file's blocks): the fused
    layers give the plain layers' greedy tokens up to the first step where the plain run's
    top-2 margin is at most two bf16 steps of its logits (0.25 at these magnitudes: a tie
    that the attention's summation order decides; at equal tokens the two runs' top
    log-probabilities were measured up to 0.27 apart, their bf16 KV caches drifting apart).
    Twelve prompts, so that the steps compared do not hang on where a few prompts' first
    near-ties fall: with five, one rounding change in the prefill products (a bucketed row
    count) moved them from 47 steps to 14, with every compared token still equal."""
    from mimo import LLM
    prompts = ["The capital of France is", "def quicksort(xs):\n", "Once upon a time, a",
               "The three primary colors are", "import numpy as np\n\n",
               "My favourite recipe for bread", "In 1969, the first", "SELECT name FROM",
               "The mitochondria is", "Dear Sir or Madam,\n", "The quick brown fox",
               "for i in range(10):\n"]
    llms = {}
    for fused in ("auto", "off"):
        llms[fused] = LLM("gemma-3-270m", progress=False, loaded=gemma_loaded,
                          fused_decode=fused, kv_cache_memory="64MiB")
        assert llms[fused].engine.weights.format == "gguf"
        assert llms[fused].engine.weights.fused_layers == (18 if fused == "auto" else 0)
    assert _agree(llms["auto"], llms["off"], prompts, 0.25, 32) >= 40
