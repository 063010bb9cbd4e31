"""The model and speed phases of mimo.bench.gpu_check: engines on the device, weights made in
code (the GPU machine fetches nothing)."""
from __future__ import annotations

import time

import torch

from ..engine.sampling_params import SamplingParams
from ..llm import LLM
from ..models.hf_config import model_config_from_hf
from ..models.registry import LoadedModel


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _tiny(name: str) -> LoadedModel:
    if name == "gemma3":
        from ..models.tiny import gemma3 as mod
    else:
        from ..models.tiny import mimo_v2_flash as mod
    cfg = mod.config()
    w = {k: v.float() for k, v in mod.weights(0).items()}
    return LoadedModel(model_config_from_hf(cfg), w, None, f"tiny-{name}")


def _greedy(loaded, device: str, backend: str, graphs: str, prompts, max_tokens: int):
    llm = LLM(loaded.source, loaded=loaded, device=device, dtype="float32",
              attention_backend=backend, decode_graphs=graphs, kv_cache_memory="64MiB",
              page_size=4, max_num_seqs=8, max_num_batched_tokens=96, progress=False)
    eng = llm.engine
    seqs = [eng.add_request(p, SamplingParams(temperature=0, max_tokens=max_tokens + i % 3,
                                              ignore_eos=True)) for i, p in enumerate(prompts)]
    while eng.has_work():
        eng.step()
        eng.check_integrity()
    steps = dict(eng.runner.bucketed.steps) if eng.runner.bucketed is not None else {}
    return [s.output_ids for s in seqs], steps


def model_phase(device: str) -> dict:
    """Each tiny model's greedy tokens through triton (graphs off; on where capturable) must
    equal the torch backend's on the same device."""
    from ..engine.graph_decode import host_syncing_modules
    from ..models import registry
    out: dict = {"ok": True}
    g = torch.Generator().manual_seed(0)
    for name in ("gemma3", "mimo_v2_flash"):
        loaded = _tiny(name)
        vocab = loaded.config.vocab_size
        prompts = [torch.randint(3, vocab, (int(n),), generator=g).tolist()
                   for n in torch.randint(3, 40, (6,), generator=g)]
        want, _ = _greedy(loaded, device, "torch", "off", prompts, 8)
        res: dict = {"tokens": sum(map(len, want))}
        got, _ = _greedy(loaded, device, "triton", "off", prompts, 8)
        res["triton"] = got == want
        model = registry.build_model(loaded.config, loaded.weights, torch.float32)
        if host_syncing_modules(model):
            res["triton_graphs"] = "not capturable (MoE routing on the host)"
        else:
            got, steps = _greedy(loaded, device, "triton", "on", prompts, 8)
            res["triton_graphs"] = got == want
            res["graph_steps"] = {f"{n}->{b}": k for (n, b), k in sorted(steps.items())}
        out[name] = res
        out["ok"] &= res["triton"] is True and res["triton_graphs"] is not False
    return out


def gemma3_270m_random(seed: int = 0) -> LoadedModel:
    """Gemma 3 270M's shapes (18 layers, 5 SWA : 1 full, window 512, vocab 262144), random
    bfloat16 weights: its speed, not its text."""
    from ..models.tiny import gemma3 as tiny
    h, inter, layers, heads, kv, d, vocab = 640, 2048, 18, 4, 1, 256, 262144
    cfg = tiny.config() | {
        "vocab_size": vocab, "hidden_size": h, "intermediate_size": inter,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
        "head_dim": d, "query_pre_attn_scalar": d, "sliding_window": 512,
        "max_position_embeddings": 32768,
        "layer_types": [("full_attention" if (i + 1) % 6 == 0 else "sliding_attention")
                        for i in range(layers)]}
    gen = torch.Generator().manual_seed(seed)

    def r(*shape, std=0.02):
        return (torch.randn(*shape, generator=gen) * std).bfloat16()
    w = {"model.embed_tokens.weight": r(vocab, h), "model.norm.weight": r(h, std=0.1)}
    for i in range(layers):
        p = f"model.layers.{i}."
        w |= {p + "self_attn.q_proj.weight": r(heads * d, h),
              p + "self_attn.k_proj.weight": r(kv * d, h),
              p + "self_attn.v_proj.weight": r(kv * d, h),
              p + "self_attn.o_proj.weight": r(h, heads * d),
              p + "self_attn.q_norm.weight": r(d, std=0.1),
              p + "self_attn.k_norm.weight": r(d, std=0.1),
              p + "mlp.gate_proj.weight": r(inter, h), p + "mlp.up_proj.weight": r(inter, h),
              p + "mlp.down_proj.weight": r(h, inter)}
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            w[p + n + ".weight"] = r(h, std=0.1)
    return LoadedModel(model_config_from_hf(cfg), w, None, "gemma-3-270m-random")


def _decode_tps(eng, streams: int, prompt: int, tokens: int, vocab: int) -> float:
    g = torch.Generator().manual_seed(streams)
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    seqs = [eng.add_request(torch.randint(3, vocab, (prompt,), generator=g).tolist(), params)
            for _ in range(streams)]
    while any(not s.output_ids for s in seqs):      # prefills done: time decodes only
        eng.step()
    _sync()
    n0, t0 = sum(len(s.output_ids) for s in seqs), time.perf_counter()
    while eng.has_work():
        eng.step()
    _sync()
    return (sum(len(s.output_ids) for s in seqs) - n0) / (time.perf_counter() - t0)


def _prefill_s(eng, n: int, vocab: int) -> float:
    g = torch.Generator().manual_seed(n)
    prompt = torch.randint(3, vocab, (n,), generator=g).tolist()
    _sync()
    t0 = time.perf_counter()
    seq = eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    while not seq.output_ids:
        eng.step()
    _sync()
    t = time.perf_counter() - t0
    while eng.has_work():
        eng.step()
    return t


def speed_phase(device: str, streams: list[int], prompt: int, tokens: int, prefill: int,
                loaded: LoadedModel | None = None) -> dict:
    """`loaded`: the model to time (default: gemma3_270m_random)."""
    loaded = loaded or gemma3_270m_random()
    vocab = loaded.config.vocab_size
    out: dict = {"model": loaded.source, "ok": True}
    for graphs in ("on", "off"):
        llm = LLM(loaded.source, loaded=loaded, device=device, dtype="bfloat16",
                  attention_backend="triton", decode_graphs=graphs, kv_cache_memory="8GiB",
                  max_num_seqs=max(streams), max_num_batched_tokens=4096,
                  max_model_len=max(prefill, prompt + tokens) + 16, prefix_cache=False,
                  progress=False)
        eng = llm.engine
        res: dict = {"decode_tps": {}}
        for s in streams:
            _decode_tps(eng, s, prompt, 4, vocab)           # compile, capture: not timed
            res["decode_tps"][str(s)] = round(_decode_tps(eng, s, prompt, tokens, vocab), 1)
        _prefill_s(eng, min(1024, prefill // 2), vocab)     # the extend kernel compiled
        t = _prefill_s(eng, prefill, vocab)
        res["prefill_s"] = round(t, 3)
        res["prefill_tps"] = round(prefill / t, 1)
        out[f"graphs_{graphs}"] = res
        del llm, eng
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return out
