"""flash-shape: mimo's engine against transformers' MiMoV2FlashForCausalLM on a MiMo-V2-Flash
scaled to fit this machine (random weights, MoE included), decode and prefill.

The shape keeps the real model's per-layer structure and scales its widths: the first layers
of its hybrid pattern (full attention on layers 0, 5, 11, ..., SWA with a 128-token window and
attention sinks elsewhere), a dense first layer then MoE layers (sigmoid routing with a
correction bias, top-k of E experts), q/k head dim 192 and v 128 with partial RoPE, SWA
layers with twice the full layers' KV heads. One set of random weights (transformers' own
initialisation, in --dtype) serves both: mimo loads transformers' state dict as its tests do.
Both run in this process on --threads threads, one after the other, with the same prompts
(random token ids, greedy, EOS never ends a stream):
  decode tok/s at each --streams count: output tokens after each stream's first / time
    after the first token (the streams decode together: mimo's continuous batching, one
    batched `generate` for transformers);
  prefill tok/s: --prefill-tokens / time to the first token of a fresh prompt (best of
    --reps).
The machine's matmul rate and memory bandwidth are measured before and after (machine_limits;
the higher of each counts); every figure is also given as a fraction of the roofline they
imply for this shape (model_cost).
One JSON line last: every figure, fraction and ratio mimo / transformers.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from mimo.config import QUANTIZE

NAME = "flash-shape"
# The real model's full-attention layers (48 layers: 9 full, 39 SWA); kvcache.pool.layout's shape.
REAL_FULL_LAYERS = (0, 5, 11, 17, 23, 29, 35, 41, 47)
SHAPE = dict(hidden=1024, layers=8, heads=16, kv_heads=1, experts=64, top_k=8,
             moe_intermediate=256, intermediate=4096, vocab=32768)
QUICK = dict(hidden=256, layers=4, heads=4, kv_heads=1, experts=8, top_k=2,
             moe_intermediate=64, intermediate=1024, vocab=4096)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="mimo vs transformers on a scaled MiMo-V2-Flash",
                              description=__doc__.split("\n\n")[0])
    for k, v in SHAPE.items():
        p.add_argument("--" + k.replace("_", "-"), type=int, default=None,
                       help=f"shape (default {v}, quick {QUICK[k]})")
    p.add_argument("--streams", default=None, help="decode stream counts (default 1,16; quick 1,4)")
    p.add_argument("--prompt-tokens", type=int, default=None, help="decode prompts (256; quick 32)")
    p.add_argument("--max-tokens", type=int, default=None, help="decode tokens (64; quick 8)")
    p.add_argument("--prefill-tokens", type=int, default=None, help="prefill prompt (2000; quick 256)")
    p.add_argument("--reps", type=int, default=2, help="prefill repetitions (best reported)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    p.add_argument("--quantize", default="auto", choices=list(QUANTIZE), help="mimo's")
    p.add_argument("--experts-implementation", default=None,
                   help="transformers' (default: its own default, grouped_mm)")
    p.add_argument("--weight-bytes", type=float, default=1.0,
                   help="bytes per weight of the memory bound's reference format (1: int8)")
    p.add_argument("--peers", default="transformers", help="transformers, or none (mimo alone)")
    p.add_argument("--quick", action="store_true", help="small shape and sizes (smoke run)")
    p.add_argument("--seed", type=int, default=0)
    return p


def _log(msg: str) -> None:
    print(f"[{NAME}] {msg}", file=sys.stderr, flush=True)


def hf_config(s: dict):
    """transformers' MiMoV2FlashConfig of the scaled shape."""
    from transformers import MiMoV2FlashConfig
    n = s["layers"]
    rope = {"rope_type": "default", "partial_rotary_factor": 0.334}
    return MiMoV2FlashConfig(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
        num_hidden_layers=n, num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
        head_dim=192, v_head_dim=128,
        layer_types=["full_attention" if i in REAL_FULL_LAYERS else "sliding_attention"
                     for i in range(n)],
        mlp_layer_types=["dense"] + ["sparse"] * (n - 1),
        rope_parameters={"full_attention": {**rope, "rope_theta": 5e6},
                         "sliding_attention": {**rope, "rope_theta": 1e4}},
        moe_intermediate_size=s["moe_intermediate"], n_routed_experts=s["experts"],
        num_experts_per_tok=s["top_k"], n_group=1, topk_group=1, sliding_window_size=128,
        max_position_embeddings=8192, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=1, pad_token_id=0)


def _prompts(rng, n: int, length: int, vocab: int) -> list[list[int]]:
    import torch
    return torch.randint(3, vocab, (n, length), generator=rng).tolist()


def _mimo(llm, rng, streams, a, vocab) -> dict:
    from .. import SamplingParams
    eng = llm.engine
    out: dict = {"decode": {}}
    params = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
    eng.add_request(_prompts(rng, 1, 16, vocab)[0], SamplingParams(temperature=0, max_tokens=4))
    while eng.has_work():
        eng.step()
    for n in streams:
        seqs = [eng.add_request(p, params) for p in _prompts(rng, n, a.prompt_tokens, vocab)]
        t0, t_first = time.perf_counter(), None
        while eng.has_work():
            eng.step()
            if t_first is None and all(s.output_ids for s in seqs):
                t_first = time.perf_counter()
        t1 = time.perf_counter()
        total = sum(len(s.output_ids) for s in seqs)
        out["decode"][str(n)] = {"decode_tok_s": round((total - n) / (t1 - t_first), 2),
                                 "ttft_s": round(t_first - t0, 4)}
        out.setdefault("tokens", {})[str(n)] = [list(s.output_ids) for s in seqs]
        _log(f"mimo, {n} stream(s): {out['decode'][str(n)]}")
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    best = float("inf")
    for p in _prompts(rng, a.reps + 1, a.prefill_tokens, vocab):   # the first warms up
        s = eng.add_request(p, one)
        t0 = time.perf_counter()
        while not s.output_ids:
            eng.step()
        best = min(best, time.perf_counter() - t0)
        while eng.has_work():
            eng.step()
    out["prefill"] = _prefill(a.prefill_tokens, best)
    _log(f"mimo prefill: {out['prefill']}")
    eng.check_integrity()
    return out


def _prefill(tokens: int, secs: float) -> dict:
    return {"tokens": tokens, "ttft_s": round(secs, 4), "prefill_tok_s": round(tokens / secs, 2)}


class _Clock:
    """A generate() streamer that only notes when each step's tokens arrive (the first put is
    the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _transformers(model, rng, streams, a, vocab) -> dict:
    import torch
    out: dict = {"decode": {}}
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        model.generate(torch.tensor(_prompts(rng, 1, 16, vocab)), max_new_tokens=4, **kw)
        for n in streams:
            ids = torch.tensor(_prompts(rng, n, a.prompt_tokens, vocab))
            clock = _Clock()
            t0 = time.perf_counter()
            gen = model.generate(ids, max_new_tokens=a.max_tokens, min_new_tokens=a.max_tokens,
                                 streamer=clock, **kw)
            first, last = clock.times[1], clock.times[-1]
            new = gen.shape[1] - ids.shape[1]
            out.setdefault("tokens", {})[str(n)] = gen[:, ids.shape[1]:].tolist()
            out["decode"][str(n)] = {"decode_tok_s": round(n * (new - 1) / (last - first), 2),
                                     "ttft_s": round(first - t0, 4)}
            _log(f"transformers, {n} stream(s): {out['decode'][str(n)]}")
        best = float("inf")
        for p in _prompts(rng, a.reps + 1, a.prefill_tokens, vocab):
            t0 = time.perf_counter()
            model.generate(torch.tensor([p]), max_new_tokens=1, **kw)
            best = min(best, time.perf_counter() - t0)
    out["prefill"] = _prefill(a.prefill_tokens, best)
    _log(f"transformers prefill: {out['prefill']}")
    return out


def _agreement(ours: dict, theirs: dict) -> dict:
    """Per stream count, the mean number of leading greedy tokens both produced alike (out
    of --max-tokens): the two ran the same weights and prompts. Random weights give
    near-flat logits, so bf16 rounding may part them early; informational only."""
    out = {}
    for n, rows in ours.items():
        same = []
        for a, b in zip(rows, theirs[n]):
            k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            same.append(k)
        out[n] = round(sum(same) / len(same), 2)
    return out


def _fractions(res: dict, cost, lim, a, streams) -> dict:
    from .peer_report import fractions
    mid = a.prompt_tokens + a.max_tokens // 2
    out = {}
    for n in streams:
        b = {k: v / n for k, v in cost.decode_step_time([mid] * n, lim).items()}
        out[f"decode_{n}"] = fractions(res["decode"][str(n)]["decode_tok_s"], b, True)
    out["prefill"] = fractions(res["prefill"]["ttft_s"], cost.prefill_time(0, a.prefill_tokens, lim),
                               False)
    return out


def _settle(a) -> tuple[dict, list[int]]:
    base = QUICK if a.quick else SHAPE
    shape = {k: getattr(a, k) if getattr(a, k) is not None else v for k, v in base.items()}
    dflt = dict(streams="1,4", prompt_tokens=32, max_tokens=8, prefill_tokens=256) if a.quick \
        else dict(streams="1,16", prompt_tokens=256, max_tokens=64, prefill_tokens=2000)
    for k, v in dflt.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    return shape, sorted({int(x) for x in a.streams.split(",")})


def _build(args, shape: dict):
    """transformers' model with random weights, and mimo's engine on its state dict."""
    import torch
    from transformers import MiMoV2FlashForCausalLM

    from .. import LLM
    from ..config import RuntimeConfig
    from ..models.hf_config import model_config_from_hf
    from ..models.registry import LoadedModel
    torch.manual_seed(args.seed)
    cfg = hf_config(shape)
    dtype = RuntimeConfig(dtype=args.dtype).dtype          # 'auto' decided for this CPU
    model = MiMoV2FlashForCausalLM._from_config(cfg, dtype=getattr(torch, dtype)).eval()
    if args.experts_implementation:
        model.set_experts_implementation(args.experts_implementation)
    mc = model_config_from_hf(cfg.to_dict())
    loaded = LoadedModel(mc, dict(model.state_dict()), None, "flash-shape")
    llm = LLM("flash-shape", progress=False, loaded=loaded, dtype=dtype,
              quantize=args.quantize, num_threads=args.threads,
              max_num_seqs=max(int(x) for x in args.streams.split(",")), kv_cache_memory="512MiB")
    return model, mc, llm


def run(args) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from .machine_limits import best_of
    from .machine_limits import measure as machine
    from .model_cost import Limits, ModelCost
    shape, streams = _settle(args)
    _log(f"machine limits on {args.threads} threads ...")
    before = machine(args.threads, args.quick)
    _log(f"matmul {before['matmul_gflops']} GFLOP/s, memory {before['bandwidth_gbs']} GB/s")
    model, mc, llm = _build(args, shape)
    cost = ModelCost(mc, weight_bytes=args.weight_bytes)
    params = sum(p.numel() for p in model.parameters())
    _log(f"shape {shape}: {params / 1e6:.0f}M parameters, {cost.active_params() / 1e6:.1f}M active "
         f"per token (+ {cost.lm_head_params() / 1e6:.1f}M LM head)")
    res = {"bench": NAME, "shape": shape, "config": {
               "layer_types": list(mc.layer_types), "mlp_types": list(mc.mlp_types),
               "sliding_window": mc.sliding_window, "head_dim": 192, "v_head_dim": 128},
           "parameters": params, "threads": args.threads, "dtype": args.dtype,
           "quantize": args.quantize, "streams": streams, "prompt_tokens": args.prompt_tokens,
           "max_tokens": args.max_tokens, "prefill_tokens": args.prefill_tokens}
    # Same seed, same calls: both engines get the same prompts.
    res["mimo"] = _mimo(llm, torch.Generator().manual_seed(args.seed + 1), streams, args,
                        shape["vocab"])
    del llm
    tokens = res["mimo"].pop("tokens")
    if "transformers" in args.peers:
        torch.set_num_threads(args.threads)
        tf = _transformers(model, torch.Generator().manual_seed(args.seed + 1), streams, args,
                           shape["vocab"])
        tf["attn_implementation"] = model.config._attn_implementation
        tf["experts_implementation"] = getattr(model.config, "_experts_implementation_internal", None)
        res["greedy_agreement"] = _agreement(tokens, tf.pop("tokens"))
        res["transformers"] = tf
    del model
    _log("machine limits again ...")
    res["machine"] = best_of(before, machine(args.threads, args.quick))
    lim = Limits(res["machine"]["bandwidth_gbs"] * 1e9, res["machine"]["matmul_gflops"] * 1e9)
    res["model_cost"] = cost.summary()
    res["fractions"] = {w: _fractions(res[w], cost, lim, args, streams)
                        for w in ("mimo", "transformers") if w in res}
    if "transformers" in res:
        m, t = res["mimo"], res["transformers"]
        ratios = {f"decode_{n}": round(m["decode"][str(n)]["decode_tok_s"]
                                       / t["decode"][str(n)]["decode_tok_s"], 4) for n in streams}
        ratios["prefill"] = round(m["prefill"]["prefill_tok_s"] / t["prefill"]["prefill_tok_s"], 4)
        res["ratios_mimo_over_transformers"] = ratios
        res["mimo_matches_or_beats"] = {k: v >= 1.0 for k, v in ratios.items()}
    print(json.dumps(res), flush=True)
    return 0
