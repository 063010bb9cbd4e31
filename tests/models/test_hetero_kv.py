"""A hybrid config whose SWA layers differ from its full layers in KV head count and in K and
V head dims (as MiMo-V2-Flash's do) runs end to end on the dual pools and matches a plain,
non-paged forward written here from the weights alone."""
import math

import pytest
import torch
import torch.nn.functional as F

from mimo import LLM, SamplingParams
from mimo.config import ModelConfig
from mimo.models.registry import LoadedModel

TYPES = ("swa", "swa", "full", "swa", "swa", "full")
SHAPES = {"full": (1, 16, 8), "swa": (2, 24, 12)}     # kv heads, k dim, v dim
HQ, HIDDEN, INTER, VOCAB, WINDOW = 4, 48, 96, 300, 6


def _config():
    return ModelConfig(
        arch="gemma3", vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER,
        num_layers=len(TYPES), num_heads=HQ, layer_types=TYPES,
        full_kv_heads=1, head_dim=16, v_head_dim=8, swa_kv_heads=2, swa_head_dim=24,
        swa_v_head_dim=12, sliding_window=WINDOW, rope_theta=1e6, rope_local_theta=1e4,
        max_position=512, query_pre_attn_scalar=20, eos_token_ids=(1,))


def _weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, std=0.1: torch.randn(*s, generator=g) * std   # noqa: E731
    w = {"model.embed_tokens.weight": r(VOCAB, HIDDEN, std=0.5), "model.norm.weight": r(HIDDEN)}
    for i, t in enumerate(TYPES):
        hkv, d, dv = SHAPES[t]
        p = f"model.layers.{i}."
        w |= {p + "self_attn.q_proj.weight": r(HQ * d, HIDDEN),
              p + "self_attn.k_proj.weight": r(hkv * d, HIDDEN),
              p + "self_attn.v_proj.weight": r(hkv * dv, HIDDEN),
              p + "self_attn.o_proj.weight": r(HIDDEN, HQ * dv),
              p + "self_attn.q_norm.weight": r(d), p + "self_attn.k_norm.weight": r(d),
              p + "mlp.gate_proj.weight": r(INTER, HIDDEN), p + "mlp.up_proj.weight": r(INTER, HIDDEN),
              p + "mlp.down_proj.weight": r(HIDDEN, INTER)}
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            w[p + n + ".weight"] = r(HIDDEN)
    return w


def _norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


def _rope(x, theta):
    """x [heads, T, d], positions 0..T-1, rotate-half convention."""
    d, T = x.shape[-1], x.shape[-2]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    ang = torch.outer(torch.arange(T).float(), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    return x * cos + torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1) * sin


def plain_forward(w, ids):
    """Whole-sequence forward with explicit masks; no cache, no paging."""
    T = len(ids)
    x = w["model.embed_tokens.weight"][ids] * math.sqrt(HIDDEN)
    pos = torch.arange(T)
    for i, t in enumerate(TYPES):
        hkv, d, dv = SHAPES[t]
        p = f"model.layers.{i}."
        h = _norm(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(T, HQ, d).transpose(0, 1)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(T, hkv, d).transpose(0, 1)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(T, hkv, dv).transpose(0, 1)
        theta = 1e6 if t == "full" else 1e4
        q = _rope(_norm(q, w[p + "self_attn.q_norm.weight"]), theta)
        k = _rope(_norm(k, w[p + "self_attn.k_norm.weight"]), theta)
        k, v = k.repeat_interleave(HQ // hkv, 0), v.repeat_interleave(HQ // hkv, 0)
        allowed = pos[None, :] <= pos[:, None]
        if t == "swa":
            allowed &= pos[None, :] > pos[:, None] - WINDOW
        s = (q @ k.transpose(-1, -2)) * 20 ** -0.5
        a = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ v
        o = a.transpose(0, 1).reshape(T, HQ * dv) @ w[p + "self_attn.o_proj.weight"].T
        x = x + _norm(o, w[p + "post_attention_layernorm.weight"])
        h = _norm(x, w[p + "pre_feedforward_layernorm.weight"])
        m = (F.gelu(h @ w[p + "mlp.gate_proj.weight"].T, approximate="tanh")
             * (h @ w[p + "mlp.up_proj.weight"].T))
        x = x + _norm(m @ w[p + "mlp.down_proj.weight"].T, w[p + "post_feedforward_layernorm.weight"])
    return _norm(x, w["model.norm.weight"]) @ w["model.embed_tokens.weight"].T


@pytest.fixture(scope="module")
def setup():
    w = _weights()
    llm = LLM("tiny", loaded=LoadedModel(_config(), w, None, "tiny"), dtype="float32",
              kv_cache_memory="4MiB", page_size=4, max_num_batched_tokens=16)
    yield w, llm
    llm.engine.check_integrity()


def test_pools_have_each_kinds_shape(setup):
    _, llm = setup
    pool = llm.engine.pool
    assert pool.full.k(0).shape[1:] == (1, 16) and pool.full.v(0).shape[1:] == (1, 8)
    assert pool.swa.k(0).shape[1:] == (2, 24) and pool.swa.v(0).shape[1:] == (2, 12)
    assert len(pool.full.layers) == 2 and len(pool.swa.layers) == 4


@pytest.mark.parametrize("chunk", [None, 5])
def test_logits_match_plain_forward(setup, chunk):
    w, llm = setup
    ids = torch.randint(2, VOCAB, (29,), generator=torch.Generator().manual_seed(1)).tolist()
    torch.testing.assert_close(llm.engine.prompt_logits(ids, chunk=chunk), plain_forward(w, ids),
                               atol=1e-4, rtol=1e-4)


def test_greedy_generation_matches_plain_forward(setup):
    w, llm = setup
    prompts = [torch.randint(2, VOCAB, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (3, 11, 20)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=15, ignore_eos=True))
    for p, out in zip(prompts, outs):
        ids = list(p)
        for _ in range(15):
            ids.append(int(plain_forward(w, ids)[-1].argmax()))
        assert out.token_ids == ids[len(p):]
