"""`python -m mimo.bench pd-bytes`: the bytes a prefill worker sends a decode worker for one
prompt, against a full-KV layout of the same model.

It runs the prompt through a real engine as a prefill worker does (max_tokens 1, the KV
handed over frame by frame as its pages become final), encodes those frames with the wire
format the workers use (`mimo.disagg.wire`), and counts the stream's bytes: every full
layer's pages and each SWA layer's window, plus the header, 12 bytes per frame and the
trailer (a full layer has one frame per prefill chunk, an SWA layer one). The yardstick is every layer's
K and V for every prompt token. Prints one JSON line.
"""
from __future__ import annotations

import json
import time


def add_parser(subparsers):
    p = subparsers.add_parser("pd-bytes", help="KV bytes one prefill -> decode transfer "
                                               "moves vs a full-KV layout")
    p.add_argument("--model", default="gemma-3-270m")
    p.add_argument("--prompt-tokens", type=int, default=8192)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--kv-cache-memory", default="1GiB")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    return p


def measure(llm, prompt_tokens: int, seed: int = 0) -> dict:
    """The transfer of one random prompt of `prompt_tokens` tokens on `llm` (a mimo.LLM)."""
    import torch

    from ..disagg import wire
    from ..engine.kv_export import KVExport
    from ..engine.sampling_params import SamplingParams
    from ..kvcache.kv_payload import full_kv_bytes

    class Frames(list):         # the sink: the engine's frames, kept in order
        def put(self, frame) -> bool:
            self.append(frame)
            return True
    eng = llm.engine
    vocab = eng.model_config.vocab_size
    ids = torch.randint(3, vocab, (prompt_tokens,),
                        generator=torch.Generator().manual_seed(seed)).tolist()
    seq = eng.new_sequence(ids, SamplingParams(temperature=0, max_tokens=1))
    frames = Frames()
    seq.kv_export = KVExport(frames)
    t0 = time.perf_counter()
    eng.enqueue(seq)
    while eng.has_work():
        eng.step()
    prefill_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    kv = sum(f.nbytes for f in frames)
    stream = (len(wire.header(eng.pool.layout, prompt_tokens, eng.pool.page_size,
                              eng.config.runtime.dtype, "bench"))
              + sum(len(c) for f in frames for c in wire.frame_chunks(f))
              + len(wire.trailer(seq.output_ids[0], 0, kv)))
    encode_s = time.perf_counter() - t1
    full = full_kv_bytes(eng.pool.layout, prompt_tokens)
    eng.check_integrity()
    return {"model": eng.config.model, "prompt_tokens": prompt_tokens,
            "dtype": eng.config.runtime.dtype, "page_size": eng.pool.page_size,
            "window": eng.pool.window, "full_layers": len(eng.pool.layout.full),
            "swa_layers": len(eng.pool.layout.swa), "kv_bytes": kv,
            "wire_bytes": stream, "frames": len(frames), "full_kv_bytes": full,
            "kv_bytes_ratio": stream / full,
            "prefill_s": round(prefill_s, 3), "encode_s": round(encode_s, 3)}


def run(args) -> int:
    from .. import LLM
    llm = LLM(args.model, dtype=args.dtype, quantize="none",
              kv_cache_memory=args.kv_cache_memory,
              max_num_batched_tokens=args.max_num_batched_tokens,
              max_model_len=max(args.prompt_tokens + 1, 2), progress=False)
    print(json.dumps(measure(llm, args.prompt_tokens, args.seed)))
    return 0
