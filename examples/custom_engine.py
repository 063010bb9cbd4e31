"""Serve an engine with a part of your own, through the real OpenAI-compatible server.

    python examples/custom_engine.py [--model NAME_OR_DIR] [--port 8000] [engine flags]

`LLMEngine` takes the engine loop's swappable parts as one `EngineParts`: the prefix cache,
the prefill planner and the decode step; any part left out is built from the config, as
`python server.py` builds it. Here the prefix cache is replaced by one of our own: the
radix tree's, wrapped to report every request it admits with cached KV (one line on stdout)
and to keep totals. The engine is then served exactly as `python server.py` serves its own:
`mimo.api.app.Server` around an `AsyncEngine`, run by `mimo.api.launch.serve` (uvicorn, on
127.0.0.1 unless --host says otherwise). Send the same prompt twice and watch the second
reuse the first one's KV:

    curl -s localhost:8000/v1/completions -H 'content-type: application/json' \\
         -d '{"model": "gemma-3-270m", "prompt": "...", "max_tokens": 8}'

The same way in: `EngineParts(prefill=MyPlanner())` (a `PrefillPlanner`: how many prompt
tokens a request computes per step) or `EngineParts(decode=MyStep())` (a `DecodeStep`: the
step's one forward and the tokens it yields).
"""
from __future__ import annotations

import argparse
import logging
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout
from mimo.api.app import Server
from mimo.api.launch import serve
from mimo.config import ConfigError, ServerConfig
from mimo.engine.async_engine import AsyncEngine
from mimo.engine.engine import LLMEngine
from mimo.engine.parts import EngineParts
from mimo.flags import add_engine_flags, engine_opts
from mimo.kvcache.radix.cache import RadixPrefixCache
from mimo.llm import engine_config


class ReportingCache(RadixPrefixCache):
    """The SWA-aware radix tree, reporting each admission that reuses cached KV."""

    def __init__(self, pool, retention, rebuild):
        super().__init__(pool, retention, rebuild=rebuild)
        self.admitted = self.hits = self.reused_tokens = 0

    def admit(self, seq, tokens, prompt_len, max_len, namespace=None) -> int:
        cached = super().admit(seq, tokens, prompt_len, max_len, namespace)
        self.admitted += 1
        if cached:
            self.hits += 1
            self.reused_tokens += cached
            print(f"[reporting-cache] reused {cached} of {len(tokens)} prompt tokens "
                  f"({self.hits} of {self.admitted} admissions hit)", flush=True)
        return cached


def build_server(args: argparse.Namespace) -> Server:
    """The engine with our prefix cache (the config's retention and window rebuild), behind
    the OpenAI-compatible app."""
    config = engine_config(args.model, **engine_opts(args))
    cc = config.cache
    parts = EngineParts(prefix_cache=lambda pool: ReportingCache(pool, cc.retention,
                                                                 cc.window_rebuild))
    engine = LLMEngine(config, parts=parts)
    return Server(ServerConfig(host=args.host, port=args.port), AsyncEngine(engine), args.model)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    add_engine_flags(p)
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(message)s")
    try:
        server = build_server(args)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return serve(server)


if __name__ == "__main__":
    sys.exit(main())
