"""generate: decode speed of mimo against transformers and llama-cpp-python, in one run.

Every engine gets the same prompts (real prose from the standard library's docs, a different
slice per stream, BOS first), greedy decoding of exactly --max-tokens tokens, and the same
thread count. Reported per engine and stream count:
  decode_tps  output tokens after the first / time after the first token (per stream for 1,
              aggregate for N concurrent streams);
  e2e_tps     all output tokens / wall time including prefill.
llama-cpp-python serves N streams one after another (it has no continuous batching), which is
what `llama_cpp_serial` reports. Ratios are computed from numbers measured side by side here.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

from mimo.config import QUANTIZE

NAME = "generate"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="decode tokens/s: mimo vs transformers vs llama.cpp",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gemma-3-270m", help="built-in name or .gguf file")
    p.add_argument("--streams", default="1,16", help="comma-separated concurrent stream counts")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="mimo's activation dtype")
    p.add_argument("--quantize", default="auto", choices=list(QUANTIZE))
    p.add_argument("--peers", default="transformers,llama-cpp",
                   help="comma-separated peers to measure (transformers, llama-cpp, none)")
    return p


def _log(msg: str) -> None:
    print(f"[{NAME}] {msg}", file=sys.stderr, flush=True)


def _prompts(tok, n_streams: int, n_tokens: int) -> list[list[int]]:
    import argparse as a
    import collections
    import inspect as i
    import json as j
    import typing
    text = "\n\n".join(i.getdoc(m) or "" for m in (a, collections, i, j, typing))
    body = tok.encode(text, add_special_tokens=False)
    step = max(1, (len(body) - n_tokens) // max(1, n_streams))
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    out = []
    for s in range(n_streams):
        start = (s * step) % max(1, len(body) - n_tokens)
        out.append(bos + body[start:start + n_tokens - len(bos)])
    return out


def _mimo(args, streams: list[int]) -> tuple[dict, object]:
    from .. import LLM, SamplingParams
    llm = LLM(args.model, progress=False, dtype=args.dtype, quantize=args.quantize,
              num_threads=args.threads, max_num_seqs=max(streams),
              kv_cache_memory="1GiB")
    eng = llm.engine
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    warm = eng.add_request(_prompts(llm.tokenizer, 1, 32)[0], SamplingParams(temperature=0, max_tokens=4))
    while warm.finish_reason is None:
        eng.step()
    res = {}
    for n in streams:
        prompts = _prompts(llm.tokenizer, n, args.prompt_tokens)
        t0 = time.perf_counter()
        seqs = [eng.add_request(p, params) for p in prompts]
        t_first = None
        while eng.has_work():
            eng.step()
            if t_first is None and all(s.output_ids for s in seqs):
                t_first = time.perf_counter()
        t1 = time.perf_counter()
        total = sum(len(s.output_ids) for s in seqs)
        res[str(n)] = {"decode_tps": round((total - n) / (t1 - t_first), 2),
                       "e2e_tps": round(total / (t1 - t0), 2), "ttft_s": round(t_first - t0, 3)}
        _log(f"mimo, {n} stream(s): {res[str(n)]}")
    eng.check_integrity()
    return res, llm


def _transformers(args, path: str, prompt: list[int]) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(args.threads)
    _log("transformers: loading the GGUF in float32 (about a minute) ...")
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    kw = dict(do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:, :16], max_new_tokens=4, **kw)
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        t_first = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens, **kw)
        wall = time.perf_counter() - t0
    n = out.shape[1] - ids.shape[1]
    res = {"decode_tps": round((n - 1) / (wall - t_first), 2), "e2e_tps": round(n / wall, 2),
           "ttft_s": round(t_first, 3)}
    _log(f"transformers (float32), 1 stream: {res}")
    del model
    return res


def _llama_cpp(args, path: str, prompts: list[list[int]], streams: list[int]) -> dict:
    from llama_cpp import Llama
    llm = Llama(model_path=path, n_ctx=args.prompt_tokens + args.max_tokens + 16,
                n_threads=args.threads, n_threads_batch=args.threads, verbose=False)

    def one(prompt):
        llm.reset()
        t0 = time.perf_counter()
        t_first, n = None, 0
        for _ in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            n += 1
            if t_first is None:
                t_first = time.perf_counter()
            if n >= args.max_tokens:
                break
        return n, t0, t_first, time.perf_counter()

    one(prompts[0][:16])
    res = {}
    n, t0, tf, t1 = one(prompts[0])
    res["1"] = {"decode_tps": round((n - 1) / (t1 - tf), 2), "e2e_tps": round(n / (t1 - t0), 2),
                "ttft_s": round(tf - t0, 3)}
    _log(f"llama-cpp-python, 1 stream: {res['1']}")
    for s in streams:
        if s == 1:
            continue
        t0 = time.perf_counter()
        total = sum(one(p)[0] for p in prompts[:s])
        wall = time.perf_counter() - t0
        res[f"{s}_serial"] = {"e2e_tps": round(total / wall, 2)}
        _log(f"llama-cpp-python, {s} streams one after another: {res[f'{s}_serial']}")
    return res


def run(args) -> int:
    streams = sorted({int(s) for s in args.streams.split(",")})
    peers = {p.strip() for p in args.peers.split(",")} - {"none", ""}
    from ..models.registry import resolve
    path = str(resolve(args.model))
    _log(f"mimo ({args.dtype}, quantize={args.quantize}), streams {streams} ...")
    mimo, llm = _mimo(args, streams)
    prompts = _prompts(llm.tokenizer, max(streams), args.prompt_tokens)
    out = {"model": args.model, "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
           "threads": args.threads, "mimo_dtype": args.dtype, "mimo": mimo}
    del llm
    if "transformers" in peers:
        out["transformers"] = {"1": _transformers(args, path, prompts[0])}
    if "llama-cpp" in peers:
        if importlib.util.find_spec("llama_cpp") is None:
            out["llama_cpp"] = "not installed (pip install llama-cpp-python)"
            _log("llama-cpp-python is not installed; skipping it")
        else:
            out["llama_cpp"] = _llama_cpp(args, path, prompts, streams)
    ratios = {}
    one = mimo.get("1", {}).get("decode_tps")
    if one and isinstance(out.get("transformers"), dict):
        ratios["mimo_1_vs_transformers_1"] = round(one / out["transformers"]["1"]["decode_tps"], 2)
    if isinstance(out.get("llama_cpp"), dict):
        lc = out["llama_cpp"]
        if one:
            ratios["mimo_1_vs_llama_cpp_1"] = round(one / lc["1"]["decode_tps"], 2)
        for s in streams:
            if f"{s}_serial" in lc:
                ratios[f"mimo_{s}_vs_llama_cpp_serial_{s}"] = round(
                    mimo[str(s)]["e2e_tps"] / lc[f"{s}_serial"]["e2e_tps"], 2)
    out["ratios"] = ratios
    print(json.dumps(out), flush=True)
    return 0
