"""agree: mimo's greedy tokens against llama-server's on the same GGUF (the default model),
token for token, up to each prompt's first step whose top-2 logit margin in llama-server's
own distribution is below --margin (0.1: the rule the transformers tests use).

mimo runs in this process at its defaults (the GGUF's own blocks through the CPU kernels
where they build, so both sides compute with the same weights); llama-server is started from
the peers directory (the peers scripts) inside the loopback-only namespace --netns, and given
mimo's token ids, so tokenization cannot differ. The margin is llama-server's logprob of its
best token minus that of its second (`n_probs`: log-softmax of the raw logits, so the logit
difference). Where a prompt's tokens part inside the compared steps, --exact (the default)
asks float32 math on the same weights (agree_exact) which token is right there, and asks
llama-server again with the same history sent as one prompt. One JSON line last.

    python -m mimo.bench agree [--peers-dir /work/peers] [--steps 24] [--margin 0.1] [--no-exact]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from .agree_exact import NEAR_TIE, ExactReference, Parting, first_parting
from .peer_servers import RunningServer, peer_spec
from .server_process import free_port

NAME = "agree"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(NAME, help="greedy tokens: mimo vs llama-server on the same GGUF")
    p.add_argument("--peers-dir", default=os.environ.get("MIMO_PEERS_DIR", "/work/peers"))
    p.add_argument("--netns", default="peers", help="network namespace (none: stay here)")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--margin", type=float, default=NEAR_TIE,
                   help="compare up to llama-server's first step with a smaller top-2 margin; "
                        "a parting where float32 math's margin is smaller is a near-tie")
    p.add_argument("--mimo-args", default="", help="LLM keywords as k=v,k=v (e.g. dtype=float32)")
    p.add_argument("--exact", action=argparse.BooleanOptionalAction, default=True,
                   help="judge each parting by float32 math on the same weights (transformers)")
    return p


def prompts() -> list[str]:
    """The GGUF reference prompts of the transformers tests (tests/models/test_gemma3_gguf)."""
    import argparse as a
    import collections
    import inspect
    long = "\n\n".join(inspect.getdoc(o) or "" for o in (
        a, collections, json, a.ArgumentParser.add_argument, collections.OrderedDict,
        json.dumps, json.loads))
    return ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
            "The following is a list of the planets of the solar system in order from the Sun: "
            "Mercury, Venus,",
            "import numpy as np\nimport matplotlib.pyplot as plt\n\nx = np.linspace(0, 10, 100)\n",
            "The secret password is BLUE-HORSE-42. Remember it.\n\n" + long
            + "\n\nQuestion: What is the secret password?\nAnswer: The secret password is"]


def _llama_greedy(port: int, ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    import httpx
    r = httpx.post(f"http://127.0.0.1:{port}/completion", timeout=600, json={
        "prompt": ids, "n_predict": steps, "temperature": 0, "n_probs": 2, "cache_prompt": False})
    r.raise_for_status()
    toks, margins = [], []
    for step in r.json()["completion_probabilities"]:
        top = step["top_logprobs"]
        toks.append(step["id"])
        margins.append(top[0]["logprob"] - top[1]["logprob"])
    return toks, margins


def run(args) -> int:
    if args.netns != "none":
        from .peers import enter_netns
        enter_netns(args.netns, NAME)
    from mimo import LLM, SamplingParams
    from mimo.models import registry
    spec = peer_spec("llama-server", Path(args.peers_dir), free_port())
    if spec.missing():
        print(json.dumps({"bench": NAME, "error": "llama-server not installed",
                          "missing": spec.missing()}))
        return 1
    opts = dict(kv.split("=", 1) for kv in args.mimo_args.split(",") if kv)
    llm = LLM("gemma-3-270m", progress=False, **opts)
    ids = [llm.tokenizer.encode(p) for p in prompts()]
    # Both stop at end of sequence: llama-server's ignore_eos bans the token (a logit bias),
    # which mimo's does not, so neither side is asked to go past it.
    params = SamplingParams(temperature=0, max_tokens=args.steps)
    ours = [o.token_ids for o in llm.generate([{"prompt_token_ids": i} for i in ids], params)]
    exact = ExactReference(registry.resolve("gemma-3-270m")) if args.exact else None
    port = int(spec.env["PORT"])
    server = RunningServer(spec, Path(tempfile.mkdtemp()) / "llama-server.log")
    rows = []
    try:
        import httpx
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        for i, (pid, mine) in enumerate(zip(ids, ours)):
            theirs, margins = _llama_greedy(port, pid, args.steps)
            n = next((k for k, m in enumerate(margins) if m < args.margin), len(margins))
            n = min(n, len(mine))
            rows.append({"prompt": i, "prompt_tokens": len(pid), "compared": n,
                         "agree": mine[:n] == theirs[:n], "mimo": mine, "llama": theirs,
                         "min_margin": round(min(margins), 4)})
            k = first_parting(mine, theirs, n)
            if k is not None and exact is not None:
                history = pid + theirs[:k]
                top, top_margin = exact.top2(history)
                again = _llama_greedy(port, history, 1)[0][0]
                rows[-1]["parted"] = Parting(k, mine[k], theirs[k], margins[k], top, top_margin,
                                             again, args.margin).as_json()
            print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        server.stop()
    w = llm.engine.weights
    print(json.dumps({"bench": NAME, "margin": args.margin, "weights": w.format,
                      "kernels": w.kernels, "dtype": llm.engine.config.runtime.dtype,
                      "all_agree": all(r["agree"] for r in rows),
                      # every parting a step where llama-server left float32 math's pick
                      # and mimo kept it, or a near-tie of that math
                      "partings_by_llama": (all(r["parted"]["verdict"] in ("llama", "near-tie")
                                                for r in rows if "parted" in r)
                                            if exact is not None else None),
                      "compared_steps": sum(r["compared"] for r in rows), "prompts": rows}))
    return 0 if all(r["agree"] for r in rows) else 1
