"""The fused decode layer (mimo/cpu/csrc/decode_layer.cpp) on multi-row steps of ragged rows,
on each kernel build this CPU runs: rows at positions from 0 to past twice the 512-key
sliding window, pages of 16 scattered cache slots, 2 to 16 rows (the most a fused step takes,
one whole weight tile), the tail counts between. Each row's output is checked against a
float64 layer written here from the dequantized blocks (no activation quantization), and
against the plain PyTorch layer on the same weights, caches and batch."""
from __future__ import annotations

import math

import pytest
import torch
from helpers.kernel_builds import kernel_build, kernel_builds

from mimo.cpu import decode_ops
from mimo.gpu.attention import AttnBatch, TorchAttention, build_attn_batch
from mimo.models import fused_decode

BUILDS = kernel_builds()
WINDOW, PAGE = 512, 16
# each row's position (its key count is that + 1, capped at the window on SWA layers)
POSITIONS = [0, 1300, 511, 7, 512, 1023, 15, 513, 16, 700, 1024, 255, 17, 510, 63, 1]


@pytest.fixture(scope="module")
def model():
    from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

    from mimo import LLM
    hf = tiny_gemma3_hf(seed=5, sliding_window=WINDOW, max_position_embeddings=2048)
    llm = LLM("tiny", loaded=loaded_from_hf(hf), dtype="float32", quantize="q8_0",
              fused_decode="off", kv_cache_memory="4MiB", progress=False)
    return llm.engine.model


def _rms(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * scale.double()


def _reference(layer, x, tables, kc, vc, b: AttnBatch) -> torch.Tensor:
    """The Gemma 3 layer in float64 on the dequantized blocks: sandwich norms, q/k norms,
    rotate-half RoPE from the tables' angles, each row's softmax over its own keys (the new
    K/V at its write slot), GELU(tanh) * up."""
    a, m = layer.attn, layer.mlp

    def w(lin):
        return lin.qweight.dense().double()
    T, hq, hkv, d, eps = x.shape[0], a.hq, a.hkv, a.d, a.qk_norm.eps
    x = x.double()
    qkv = _rms(x, layer.input_norm.scale, eps) @ w(a.qkv).T
    nqk = (hq + hkv) * d
    qk = _rms(qkv[:, :nqk].view(T, hq + hkv, d), a.qk_norm.scale, eps)
    cos, sin = (t.double().view(T, 1, d)[..., d // 2:] for t in tables)   # second halves: +sin
    x1, x2 = qk[..., :d // 2], qk[..., d // 2:]
    qk = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    q, k = qk[:, :hq], qk[:, hq:]
    v = qkv[:, nqk:].view(T, hkv, a.dv) * a.v_scale
    keys, vals = kc.double().clone(), vc.double().clone()
    keys[b.write_slots], vals[b.write_slots] = k, v
    att = torch.zeros(T, hq, a.dv, dtype=torch.float64)
    for t in range(T):
        s = b.decode_slots[t, :b.decode_lens[t]]
        for h in range(hq):
            g = h // (hq // hkv)
            p = torch.softmax(keys[s, g] @ q[t, h] * a.scale, 0)
            att[t, h] = p @ vals[s, g]
    x = x + _rms(att.view(T, -1) @ w(a.o).T, layer.post_attn_norm.scale, eps)
    gate, up = (_rms(x, layer.pre_ff_norm.scale, eps) @ w(m.gate_up).T).chunk(2, -1)
    act = 0.5 * gate * (1 + torch.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate ** 3)))
    return x + _rms((act * up) @ w(m.down).T, layer.post_ff_norm.scale, eps)


def _batch(positions, window, g, N):
    """Decode rows at `positions`, each sequence's slots in pages of 16 drawn at random."""
    pages = torch.randperm(N // PAGE, generator=g)
    owner, used = {}, 0
    for r, p in enumerate(positions):
        n = -(-(p + 1) // PAGE)
        owner[r] = (pages[used:used + n, None] * PAGE + torch.arange(PAGE)).reshape(-1)
        used += n
    return build_attn_batch([(r, p, 1, r, 0, 0) for r, p in enumerate(positions)], window,
                            lambda h, a, b: owner[h][a:b], "cpu", torch.float32)


@pytest.mark.parametrize("isa", BUILDS)
@pytest.mark.parametrize("rows", [2, 5, 13, 16])
def test_ragged_rows_equal_float64_and_the_plain_layer(model, isa, rows):
    """Per row: the fused layer's error against float64 stays within the plain layer's
    (both quantize their activations to 8 bits), and its output equals the plain layer's
    up to float32 summation order (with at most a few int8 rounding flips)."""
    with kernel_build(isa):
        _check_ragged_rows(model, decode_ops.load(isa.partition("+")[0]), rows)


def _check_ragged_rows(model, ops, rows):
    assert ops is not None
    assert model.fuse_decode(ops) == len(model.layers)
    g = torch.Generator().manual_seed(rows)
    positions = POSITIONS[:rows]
    N = PAGE * sum(-(-(p + 1) // PAGE) for p in POSITIONS) + 4 * PAGE
    assert {layer.kind for layer in model.layers} == {"swa", "full"}
    for i, layer in enumerate(model.layers):
        window = WINDOW if layer.kind == "swa" else None
        batch = _batch(positions, window, g, N)
        assert fused_decode.step_fits(torch.zeros(rows, 1), {layer.kind: batch}, TorchAttention())
        lens = [min(p + 1, window or p + 1) for p in positions]
        assert batch.decode_lens.tolist() == lens
        kc0 = torch.randn(N, layer.attn.hkv, layer.attn.d, generator=g)
        vc0 = torch.randn(N, layer.attn.hkv, layer.attn.dv, generator=g)
        x = torch.randn(rows, model.cfg.hidden_size, generator=g) * 2
        tables = model.rope[layer.kind].tables(torch.tensor(positions))
        ref = _reference(layer, x, tables, kc0, vc0, batch)
        kp, vp = kc0.clone(), vc0.clone()
        plain = layer(x, tables, kp, vp, batch, TorchAttention())
        kf, vf = kc0.clone(), vc0.clone()
        got = fused_decode.run(model._fused[i], x, tables, kf, vf, batch)
        update = (ref - x).norm(dim=1)
        err_fused = (got.double() - ref).norm(dim=1) / update
        err_plain = (plain.double() - ref).norm(dim=1) / update
        assert (err_plain < 0.05).all(), (layer.kind, err_plain)
        assert (err_fused <= 1.5 * err_plain + 1e-4).all(), (layer.kind, lens, err_fused, err_plain)
        assert ((got - plain).norm(dim=1) <= 1e-3 * update).all(), (layer.kind, lens)
        torch.testing.assert_close(kf, kp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(vf, vp, rtol=1e-5, atol=1e-5)
        untouched = torch.ones(N, dtype=torch.bool)
        untouched[batch.write_slots] = False
        assert (kf[untouched] == kc0[untouched]).all() and (vf[untouched] == vc0[untouched]).all()


@pytest.mark.parametrize("isa", BUILDS)
def test_any_number_of_threads_gives_the_same_bits(model, isa):
    """The fused layer runs as one team of threads with barriers between its steps
    (csrc/team.h); who computes which tile, head or key part must not change a bit. With 4
    rows every thread count up to 4 splits attention the same way (one key part per row and
    KV head), so teams of 1 to 4 threads (more than this machine's cores included) give
    identical outputs and caches."""
    rows = 4
    positions = POSITIONS[:rows]
    N = PAGE * sum(-(-(p + 1) // PAGE) for p in positions) + 4 * PAGE
    threads = torch.get_num_threads()
    with kernel_build(isa):
        ops = decode_ops.load(isa.partition("+")[0])
        assert ops is not None and model.fuse_decode(ops) == len(model.layers)
        try:
            for i, layer in enumerate(model.layers):
                g = torch.Generator().manual_seed(100 + i)
                batch = _batch(positions, WINDOW if layer.kind == "swa" else None, g, N)
                kc0 = torch.randn(N, layer.attn.hkv, layer.attn.d, generator=g)
                vc0 = torch.randn(N, layer.attn.hkv, layer.attn.dv, generator=g)
                x = torch.randn(rows, model.cfg.hidden_size, generator=g) * 2
                tables = model.rope[layer.kind].tables(torch.tensor(positions))
                outs = []
                for n in (1, 2, 3, 4):
                    torch.set_num_threads(n)
                    kf, vf = kc0.clone(), vc0.clone()
                    outs.append((fused_decode.run(model._fused[i], x, tables, kf, vf, batch),
                                 kf, vf))
                for n, (y, kf, vf) in zip((2, 3, 4), outs[1:]):
                    assert torch.equal(y, outs[0][0]), (layer.kind, n)
                    assert torch.equal(kf, outs[0][1]) and torch.equal(vf, outs[0][2]), n
                assert not torch.equal(outs[0][1], kc0)       # the step wrote its keys
        finally:
            torch.set_num_threads(threads)
