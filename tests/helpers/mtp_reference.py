"""A plain (non-paged, whole-sequence) forward of MiMo-V2-Flash's MTP layers, written from the
hub checkpoint's weight layout for the tiny test config (4 query / 2 KV heads, head dims
24 / 16): the reference the paged `mtp_forward` and the MTP drafter's KV are checked against."""
import math

import torch
import torch.nn.functional as F


def mtp_weights(hf, K: int, seed=3) -> dict:
    """Random MTP layers in the hub checkpoint's layout (model.mtp.layers.{k}.*)."""
    c = hf.config
    g = torch.Generator().manual_seed(seed)
    H, hq, hkv, d, dv, inter = c.hidden_size, 4, 2, 24, 16, c.intermediate_size
    r = lambda *s, std=0.08: torch.randn(*s, generator=g) * std   # noqa: E731
    one = lambda n: 1.0 + r(n, std=0.3)                           # noqa: E731
    w = {}
    for k in range(K):
        p = f"model.mtp.layers.{k}."
        w |= {p + "enorm.weight": one(H), p + "hnorm.weight": one(H),
              p + "eh_proj.weight": r(H, 2 * H), p + "input_layernorm.weight": one(H),
              p + "pre_mlp_layernorm.weight": one(H), p + "final_layernorm.weight": one(H),
              p + "self_attn.q_proj.weight": r(hq * d, H), p + "self_attn.k_proj.weight": r(hkv * d, H),
              p + "self_attn.v_proj.weight": r(hkv * dv, H), p + "self_attn.o_proj.weight": r(H, hq * dv),
              p + "self_attn.attention_sink_bias": r(hq, std=1.0),
              p + "mlp.gate_proj.weight": r(inter, H), p + "mlp.up_proj.weight": r(inter, H),
              p + "mlp.down_proj.weight": r(H, inter)}
    return w


def _norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, theta, rd):
    """x [heads, T, d]: rotate-half RoPE on the first rd dims only."""
    inv = 1.0 / theta ** (torch.arange(0, rd, 2).float() / rd)
    ang = torch.outer(pos.float(), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    xr, xp = x[..., :rd], x[..., rd:]
    rot = torch.cat([-xr[..., rd // 2:], xr[..., :rd // 2]], -1)
    return torch.cat([xr * cos + rot * sin, xp], -1)


def plain_mtp(w, k, tokens, h_prev, cfg, with_kv=False):
    """MTP layer k over positions 0..T-1, whole sequence at once: SWA attention (window from
    transformers' config, sinks, partial RoPE, values scaled by 0.707 as vLLM does), dense MLP.
    `with_kv`: also the layer's cached keys (after RoPE) and values (scaled), [T, hkv, d]."""
    p, eps, T = f"model.mtp.layers.{k}.", cfg.rms_norm_eps, len(tokens)
    hq, hkv, d, dv = 4, 2, 24, 16
    rp = cfg.rope_parameters["sliding_attention"]
    x = torch.cat([_norm(w["model.embed_tokens.weight"][tokens], w[p + "enorm.weight"], eps),
                   _norm(h_prev, w[p + "hnorm.weight"], eps)], -1) @ w[p + "eh_proj.weight"].T
    h = _norm(x, w[p + "input_layernorm.weight"], eps)
    pos = torch.arange(T)
    q = (h @ w[p + "self_attn.q_proj.weight"].T).view(T, hq, d).transpose(0, 1)
    kk = (h @ w[p + "self_attn.k_proj.weight"].T).view(T, hkv, d).transpose(0, 1)
    v = (h @ w[p + "self_attn.v_proj.weight"].T).view(T, hkv, dv).transpose(0, 1) * 0.707
    rd = int(d * rp["partial_rotary_factor"])
    q, kk = _rope(q, pos, rp["rope_theta"], rd), _rope(kk, pos, rp["rope_theta"], rd)
    cached = (kk.transpose(0, 1), v.transpose(0, 1))
    kk, v = kk.repeat_interleave(hq // hkv, 0), v.repeat_interleave(hq // hkv, 0)
    allowed = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - cfg.sliding_window)
    s = ((q @ kk.transpose(-1, -2)) / math.sqrt(d)).masked_fill(~allowed, float("-inf"))
    sink = w[p + "self_attn.attention_sink_bias"].view(hq, 1, 1).expand(hq, T, 1)
    a = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1] @ v
    x = x + a.transpose(0, 1).reshape(T, hq * dv) @ w[p + "self_attn.o_proj.weight"].T
    h = _norm(x, w[p + "pre_mlp_layernorm.weight"], eps)
    m = F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
    out = _norm(x + m @ w[p + "mlp.down_proj.weight"].T, w[p + "final_layernorm.weight"], eps)
    return (out, *cached) if with_kv else out
