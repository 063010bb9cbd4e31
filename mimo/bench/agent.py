"""agent: multi-turn agent sessions with tool-call pauses, replayed against mimo and
llama-server at the same KV memory, and through the radix tree at MiMo-V2-Flash's shapes.

Sessions come from stated distributions (agent_trace.AgentTraceSpec, seeded) and, when the
trace file is there, from the Mooncake conversation trace. Real servers (one at a time, in
the loopback-only network namespace --netns): llama-server (its start script, -c/-np given)
and mimo (server.py, --kv-cache-memory set to llama-server's KV bytes) replay the same
sessions as token-id completions (agent_replay `ids`); then mimo replays them as chat with a
forced tool call per paused turn (`chat`) with --tool-pause-hold on and 0, where the server
knows a session is paused. (llama-server's Gemma 3 template renders no tools: it answers
tool_choice "required" with text and refuses tool messages, so it has no chat run.)
The simulator half (agent_sim.py) sweeps KV budgets with the hold on and off.
Reported per run: hit rate (cached prompt tokens / prompt tokens) overall and on resumed
turns, TTFT p50/p90, output tokens/s. Progress on stderr; one JSON line last on stdout,
with the CPU and its flags.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

from ..config import parse_size
from . import DEFAULT_TRACE
from .agent_replay import Replayer
from .agent_sim import simulate
from .agent_trace import AgentTraceSpec, Session, metrics, mooncake_sessions, synthetic
from .peer_servers import RunningServer, mimo_spec, peer_spec
from .server_process import free_port

NAME = "agent"
VOCAB = (300, 250000)        # token ids the replays draw from (Gemma 3's vocabulary)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="agent sessions with tool-call pauses: mimo vs "
                              "llama-server, paused-session hold on/off",
                              description=__doc__.split("\n\n")[0])
    d = AgentTraceSpec()
    for f in dataclasses.fields(AgentTraceSpec):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(d, f.name)),
                       default=getattr(d, f.name), help=f"trace: {f.name} (default %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help="smoke sizes: 3 sessions of 2-3 turns, 2 at once; a small simulation")
    p.add_argument("--servers", default="llama-server,mimo,mimo-chat",
                   help="real runs, comma-separated: llama-server, mimo (token-id replay), "
                        "mimo-chat (chat with tool calls, hold on and off); none: simulator only")
    p.add_argument("--mooncake", type=int, default=2,
                   help="Mooncake conversation sessions added to the real runs (0: none)")
    p.add_argument("--trace", default=str(DEFAULT_TRACE), help="Mooncake conversation trace")
    p.add_argument("--block", type=int, default=16,
                   help="tokens per Mooncake block in the real runs (512 in the trace)")
    p.add_argument("--llama-ctx", type=int, default=8192, help="llama-server -c")
    p.add_argument("--llama-slots", type=int, default=4, help="llama-server -np")
    p.add_argument("--hold", type=float, default=120.0, help="--tool-pause-hold when on")
    p.add_argument("--mimo-args", default="", help="extra flags for mimo's server.py")
    p.add_argument("--peers-dir", default=os.environ.get("MIMO_PEERS_DIR", "/work/peers"))
    p.add_argument("--netns", default="peers", help="loopback-only namespace (none: stay)")
    p.add_argument("--sim-budgets", default="2GiB,3GiB,4GiB,6GiB",
                   help="KV budgets of the simulator's synthetic sessions (MiMo-V2-Flash "
                        "shapes; 4,096-token system prompt, 1,024-token user turns, 768-token "
                        "tool results, 256-token answers, 2-12 turns, pauses 5 s median, 16 "
                        "sessions at once); none: skip the simulator")
    p.add_argument("--sim-sessions", type=int, default=100)
    p.add_argument("--sim-swa-share", type=float, default=0.25,
                   help="the simulator's SWA pool share of each budget")
    p.add_argument("--mooncake-budgets", default="50GiB,100GiB",
                   help="KV budgets of the simulator's Mooncake conversation replay (none: skip)")
    p.add_argument("--mooncake-limit", type=int, default=4000,
                   help="first requests of the Mooncake trace the simulator replays")
    p.add_argument("--plot", default=None, help="write a PNG here (e.g. docs/agent_sessions.png)")
    return p


def llama_kv_bytes(ctx: int, slots: int) -> int:
    """llama-server's f16 KV for Gemma 3 270M (18 layers, 1 KV head of 256; 3 global layers
    hold `ctx` cells, 15 sliding ones min(ctx, 512 x (slots + 1)) cells)."""
    per_layer_cell = 2 * 256 * 2
    return 3 * ctx * per_layer_cell + 15 * min(ctx, 512 * (slots + 1)) * per_layer_cell


def _log(msg: str) -> None:
    print(f"[agent] {msg}", file=sys.stderr, flush=True)


async def _replay(url: str, kind: str, mode: str, sessions: list[Session], spec) -> dict:
    rp = Replayer(url, mode, spec.seed, VOCAB, spec.system_tokens, kind=kind)
    try:
        await _ready(rp)
        wall = await rp.run(sessions, spec.concurrency, label=f"{kind} {mode}")
    finally:
        await rp.aclose()
    return {**metrics(rp.records, wall), "errors": rp.errors[:5], "n_errors": len(rp.errors),
            "records": rp.records}


async def _ready(rp: Replayer, timeout: float = 600.0) -> None:
    import httpx
    for _ in range(int(timeout / 0.5)):
        try:
            r = await rp.http.get(f"{rp.base}/v1/models")
            if r.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.5)
    raise TimeoutError("server not ready")


def _serve(name: str, args, port: int, extra: list[str], logdir: Path) -> RunningServer:
    if name == "llama-server":
        spec = peer_spec(name, Path(args.peers_dir), port,
                         ("-c", str(args.llama_ctx), "-np", str(args.llama_slots)))
    else:
        spec = mimo_spec(port, extra)
    missing = spec.missing()
    if missing:
        raise FileNotFoundError(f"{name} not installed: missing {missing}")
    return RunningServer(spec, logdir / f"{name}-{port}.log")


def real_runs(args, sessions: list[Session], spec: AgentTraceSpec) -> dict:
    kv = llama_kv_bytes(args.llama_ctx, args.llama_slots)
    base = ["--kv-cache-memory", str(kv), *args.mimo_args.split()]
    plan = []
    for s in [x.strip() for x in args.servers.split(",") if x.strip() and x != "none"]:
        if s == "llama-server":
            plan.append(("llama-server", "llama-server", "ids", []))
        elif s == "mimo":
            plan.append(("mimo", "mimo", "ids", base + ["--tool-pause-hold", str(args.hold)]))
        elif s == "mimo-chat":
            plan += [(f"mimo-chat-hold-{h:g}", "mimo", "chat",
                      base + ["--tool-pause-hold", str(h)]) for h in (args.hold, 0.0)]
        else:
            raise SystemExit(f"agent: unknown server {s!r}")
    out = {"kv_bytes": kv}
    logdir = Path(tempfile.mkdtemp(prefix="mimo-agent-"))
    for label, kind, mode, extra in plan:
        port = free_port()
        _log(f"starting {label} on port {port} (KV {kv / 2**20:.1f} MiB)")
        srv = _serve(kind, args, port, extra, logdir)
        try:
            sess = [s for s in sessions if mode == "ids" or not s.turns[0].blocks]
            out[label] = asyncio.run(_replay(f"http://127.0.0.1:{port}", kind, mode, sess,
                                             spec))
        except Exception as e:  # noqa: BLE001 - reported in the JSON, the next run goes on
            out[label] = {"error": repr(e)[:300], "log_tail": srv.log_tail(800)}
        finally:
            srv.stop()
        r = out[label]
        _log(f"{label}: hit {r.get('hit_rate')}, resumed {r.get('resumed_hit_rate')}, "
             f"TTFT p50 {r.get('ttft_p50_s')} p90 {r.get('ttft_p90_s')}")
    return out


def run(args) -> int:
    from .agent_plot import plot
    from .peers import enter_netns
    spec = AgentTraceSpec(**{f.name: getattr(args, f.name)
                             for f in dataclasses.fields(AgentTraceSpec)})
    if args.quick:
        spec = dataclasses.replace(spec, sessions=3, concurrency=2, turns_min=2, turns_max=3)
        args.mooncake, args.sim_sessions = min(args.mooncake, 1), 40
    servers = args.servers != "none"
    if servers and args.netns != "none":
        enter_netns(args.netns, NAME)
    sessions = synthetic(spec)
    reqs = None
    if Path(args.trace).is_file():
        from .sim_cache import load_trace
        reqs = load_trace(args.trace)
    else:
        _log(f"no Mooncake trace at {args.trace}: synthetic sessions only")
    if reqs and args.mooncake:
        moon = mooncake_sessions(reqs, args.mooncake, time_scale=0.01,
                                 pause_max_s=spec.pause_max_s)
        # Answers as long as the synthetic ones: the trace's hundreds of tokens would be
        # mostly decode time on a CPU, and the next turn does not resend them anyway.
        sessions += [Session(len(sessions) + i, tuple(
            dataclasses.replace(t, output_tokens=min(t.output_tokens, spec.output_tokens))
            for t in s.turns)) for i, s in enumerate(moon)]
    res: dict = {"bench": NAME, "trace": dataclasses.asdict(spec), "quick": args.quick,
                 "sessions": len(sessions), "turns": sum(len(s.turns) for s in sessions)}
    if servers:
        res["real"] = real_runs(args, sessions, spec)
    rows: list[dict] = []
    if args.sim_budgets != "none":
        sim_spec = dataclasses.replace(spec, sessions=args.sim_sessions,
                                       concurrency=max(spec.concurrency, 16),
                                       system_tokens=4096, user_tokens=1024, tool_tokens=768,
                                       output_tokens=256, pause_s=5.0, pause_max_s=60.0,
                                       turns_min=2, turns_max=12)
        res["sim_trace"] = dataclasses.asdict(sim_spec)
        rows += simulate("synthetic", synthetic(sim_spec),
                         [parse_size(b) for b in args.sim_budgets.split(",")], args.hold,
                         "mimo-v2-flash", args.sim_swa_share, sim_spec.concurrency, 2.0,
                         sim_spec.system_tokens, _log)
    if reqs and not args.quick and args.mooncake_budgets != "none":
        rows += simulate("mooncake", reqs[:args.mooncake_limit],
                         [parse_size(b) for b in args.mooncake_budgets.split(",")],
                         args.hold, "mimo-v2-flash", args.sim_swa_share, log=_log)
    res["sim"] = rows
    from ..cpu.features import cpu_info
    info = cpu_info()
    res.update(cpu=info.model, cpu_flags=sorted(info.flags))
    if args.plot:
        plot(res, args.plot)
        res["plot"] = args.plot
    for r in (res.get("real") or {}).values():
        if isinstance(r, dict):
            r.pop("records", None)
    print(json.dumps(res), flush=True)
    return 0
