"""Command line: `python -m mimo generate "prompt"`."""
from __future__ import annotations

import argparse
import sys
import time

from .config import ConfigError


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """Engine flags shared by every command that loads a model; each maps 1:1 to a config
    field (mimo/config.py)."""
    g = p.add_argument_group("engine")
    g.add_argument("--model", default="gemma-3-270m",
                   help="built-in name (gemma-3-270m), a .gguf file, or a Hugging Face directory")
    g.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="activation and KV dtype (float32 reproduces reference numerics)")
    g.add_argument("--quantize", default="auto", choices=["auto", "none", "int8"],
                   help="int8 weight copies for small-batch matmuls (auto: on for CPU bfloat16)")
    g.add_argument("--kv-cache-memory", default="1GiB", help="byte budget of both KV pools")
    g.add_argument("--page-size", type=int, default=16, help="tokens per KV page")
    g.add_argument("--swa-share", type=float, default=None,
                   help="fraction of the KV budget for the SWA pool (default: from model shapes)")
    g.add_argument("--prefix-cache", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the KV of cached prompt prefixes (SWA-aware radix tree; "
                        "--no-prefix-cache turns it off)")
    g.add_argument("--retention", default="hybrid-output",
                   choices=["hybrid-output", "hybrid", "prompt-only", "keep-all"],
                   help="which SWA KV the prefix cache keeps after a request: hybrid-output "
                        "(prompt, output end, branch points, sparse grid), hybrid (the same "
                        "without outputs: for models whose next turn drops them), prompt-only, "
                        "keep-all")
    g.add_argument("--window-rebuild", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse a cached prefix whose SWA window was not kept by recomputing "
                        "only the SWA layers' receptive field before its end ((window - 1) "
                        "x SWA layers tokens), not everything since the last kept window")
    g.add_argument("--max-num-seqs", type=int, default=64, help="most requests running at once")
    g.add_argument("--max-num-batched-tokens", type=int, default=512,
                   help="token budget of one step (prefill chunk size)")
    g.add_argument("--max-model-len", type=int, default=None, help="context limit (default: model's)")
    g.add_argument("--policy", default="compute-aware", choices=["compute-aware", "fcfs"],
                   help="waiting-queue order: fewest uncached prompt tokens first (with aging), "
                        "or arrival order")
    g.add_argument("--aging-per-second", type=float, default=1000.0,
                   help="compute-aware aging: a waiting request gains this many tokens of "
                        "priority per second (bounds every wait)")
    g.add_argument("--admission", default="reserve", choices=["reserve", "optimistic"],
                   help="reserve: admit when prompt + max_tokens fit (no preemption); "
                        "optimistic: admit when the prompt fits, preempt the newest request "
                        "if decoding runs out of KV (its KV stays in the prefix cache)")
    g.add_argument("--length-buckets", default=None,
                   help="comma-separated prompt-length cut points, e.g. 4096,16384: one "
                        "prefill batch holds one bucket only (default: none)")
    g.add_argument("--speculative", default=None, choices=["ngram", "mtp"],
                   help="speculative decoding: ngram (prompt lookup, any model) or mtp (the "
                        "model's MTP layers); default off")
    g.add_argument("--num-draft-tokens", type=int, default=4,
                   help="draft tokens verified per decoding request and step (mtp: "
                        "clamped to the model's MTP layer count)")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    g.add_argument("--device", default="cpu")


def _buckets(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--length-buckets takes comma-separated integers, not {text!r}")


def engine_opts(a: argparse.Namespace) -> dict:
    return dict(dtype=a.dtype, quantize=a.quantize, kv_cache_memory=a.kv_cache_memory,
                page_size=a.page_size, swa_share=a.swa_share, max_num_seqs=a.max_num_seqs,
                prefix_cache=a.prefix_cache, retention=a.retention,
                window_rebuild=a.window_rebuild,
                max_num_batched_tokens=a.max_num_batched_tokens, max_model_len=a.max_model_len,
                num_threads=a.threads, device=a.device, policy=a.policy,
                aging_per_second=a.aging_per_second, admission=a.admission,
                length_buckets=_buckets(a.length_buckets),
                speculative=a.speculative, num_draft_tokens=a.num_draft_tokens)


def _generate(a: argparse.Namespace) -> int:
    from . import LLM, SamplingParams
    llm = LLM(a.model, **engine_opts(a))
    params = SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p,
                            top_k=a.top_k, seed=a.seed)
    eng, tok = llm.engine, llm.tokenizer
    seq = eng.add_request(tok.encode(a.prompt), params)
    printed = ""
    t0 = time.perf_counter()
    sys.stdout.write(a.prompt)
    while seq.finish_reason is None:
        eng.step()
        text = tok.decode(seq.output_ids)
        # A multi-byte character may be split across tokens: hold back a trailing U+FFFD.
        stable = text.rstrip("\ufffd") if seq.finish_reason is None else text
        if stable.startswith(printed):
            sys.stdout.write(stable[len(printed):])
            sys.stdout.flush()
            printed = stable
    dt = time.perf_counter() - t0
    sys.stdout.write("\n")
    print(f"[{len(seq.output_ids)} tokens in {dt:.2f}s, {len(seq.output_ids) / dt:.1f} tokens/s, "
          f"finish: {seq.finish_reason}]", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mimo", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="generate a continuation of a prompt")
    g.add_argument("prompt")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)
    add_engine_flags(g)
    a = p.parse_args(argv)
    try:
        return _generate(a)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
