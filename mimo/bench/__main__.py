"""`python -m mimo.bench <command> ...`: one subcommand per module.

Each module in COMMANDS defines
    add_parser(subparsers) -> argparse.ArgumentParser   # subparsers.add_parser(name, ...)
    run(args) -> int | None                             # exit status (None means 0)
Modules are imported here only, so a benchmark with heavy imports (torch models) costs
nothing to the others beyond its import.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# Add new benchmarks here (module path relative to this package), one per line.
COMMANDS = [
    ".kv_capacity",      # kv-capacity: requests per KV budget, hybrid vs full-kv
    ".generate",         # generate: decode tokens/s, mimo vs transformers vs llama.cpp
    ".cache_sim",        # cache-sim: prefix-cache hit rate of a trace, per policy and budget
    ".serve",            # serve: TTFT per waiting-queue policy, a trace replayed on real servers
    ".encoder",          # encoder: vision encoder QPS / p90, cross-request batching off vs on
    ".spec",             # spec: decode tokens/s with vs without speculative decoding
    ".video_decode",     # video-decode: chunked parallel video decoding, time per worker count
    ".tiers",            # tiers: TTFT and bytes moved per KV tier (L2, disk, Redis)
    ".soak",             # soak: mixed requests, disconnects, timeouts on one server; nothing stuck or leaked
    ".structured",       # structured: decode tokens/s with a JSON-schema grammar vs without
    ".route",            # route: cache-aware router vs round-robin on 4 workers
    ".peers",            # peers: mimo vs vLLM CPU vs llama-server, as machine-limit fractions
    ".agree",           # agree: greedy tokens, mimo vs llama-server on the same GGUF (margin rule)
    ".kernels",          # kernels: the CPU kernels (GGUF blocks) against the memory read rate
    ".prefill_gemm",     # prefill-gemm: prefill's products on the GGUF blocks vs the dense GEMM
    ".flash_shape",      # flash-shape: mimo vs transformers on a scaled MiMo-V2-Flash, decode and prefill
    ".agent",            # agent: multi-turn agent sessions with tool-call pauses, mimo vs llama-server
    ".pd_bytes",         # pd-bytes: KV bytes one prefill -> decode transfer moves vs full KV
    ".pd",               # pd: PD workers vs colocated workers, TTFT / inter-token latency / KV bytes
    ".encoders",         # encoders: embedding-cache hit rate, hash vs round-robin, shared memory off vs on
    ".pd_transport",     # pd-transport: KV transfer time, direct worker stream vs the Redis tier path
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mimo.bench", description=__doc__.split("\n")[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        mod = importlib.import_module(name, __package__)
        sub = mod.add_parser(subparsers)
        sub.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args._run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
