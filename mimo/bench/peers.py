"""peers: mimo against vLLM's CPU build and llama.cpp's llama-server on the same model
(Gemma 3 270M), the same requests, one server at a time, in one run.

Each installed peer (set up by the peers scripts under --peers-dir; one that is not is
reported "not installed" with the paths looked for), then mimo (server.py at its defaults
plus --mimo-args, from this checkout and this python), is started on the same port inside the
loopback-only network namespace --netns (the bench re-executes itself there, so its client
shares that loopback), timed to its first answered request, sent the workload of peer_load
(a: 1 stream, b: concurrent streams, c: a long prompt twice, d: a long prompt sharing a
prefix with an earlier one), and stopped, its process group killed and checked for leaks,
before the next starts. With --rounds N the servers take turns N times, in reverse order
every other round (A B C, C B A, A B C: a slow spell of a shared machine, minutes long,
falls on different servers' turns), each started afresh; each row's value is then the
median of its rounds (every round's kept beside it), as is the start-up. Before the first
server starts and after the last one stops, the machine's matmul rate and memory bandwidth
are measured (machine_limits; the higher of each counts), and every figure is reported as a
fraction of the roofline they imply for this model (model_cost). The read rate alone is
also measured between turns, and each row's memory fraction is reported a second time
against the rates next to each turn (the higher of the one before and the one after it,
the median over a server's rounds): this machine's read rate moves by up to 2x within
minutes, more than a run's figures do. Progress on stderr; one
JSON line last on stdout: every figure, every fraction, mimo / best peer per row, and
whether mimo matches or beats the best peer on each.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from .machine_limits import best_of
from .peer_load import QUICK, Client, Workload, run_workload, wait_ready
from .peer_servers import PEERS, RunningServer, mimo_spec, peer_spec
from .server_process import ROOT, free_port

NAME = "peers"
DEFAULT_MODEL = "gemma-3-270m"
SIZES = ("prompt_tokens", "max_tokens", "single_runs", "long_runs", "concurrency",
         "long_tokens", "shared_prefix")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="mimo vs vLLM CPU vs llama-server on one model",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--peers", default="vllm,llama-server",
                   help="comma-separated subset of vllm,llama-server, or none (mimo alone)")
    p.add_argument("--peers-dir", default=os.environ.get("MIMO_PEERS_DIR", "/work/peers"),
                   help="where the peers scripts set the peers up (default: $MIMO_PEERS_DIR "
                        "or /work/peers)")
    p.add_argument("--quick", action="store_true",
                   help="smoke sizes: 32 output tokens, 4 streams, 1 single run, 1 long run, "
                        "1,200-token prompts sharing 800; small machine-limit buffers")
    p.add_argument("--mimo-args", default="", help="extra flags for mimo's server.py (one string)")
    p.add_argument("--mimo-dir", default=str(ROOT),
                   help="the mimo checkout whose server.py runs (default: this one; e.g. a "
                        "git worktree of an older commit, for start-up before and after)")
    p.add_argument("--vllm-args", default="", help="extra flags for `vllm serve` (one string)")
    p.add_argument("--llama-args", default="",
                   help="extra flags for llama-server (one string; e.g. --llama-args=-nr "
                        "where its AMX kernels die of SIGILL, see docs/speed.md)")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="the model mimo serves and the costs are computed for; another than "
                        f"{DEFAULT_MODEL} only when no peer is installed or with --peers none "
                        "(the peers serve that one)")
    p.add_argument("--port", type=int, default=8090,
                   help="every server's port, one at a time (0: a free one, picked inside the namespace)")
    p.add_argument("--netns", default="peers",
                   help="network namespace to run in (loopback only); none: this one")
    p.add_argument("--threads", type=int, default=2, help="threads of the machine-limit runs")
    p.add_argument("--weight-bytes", type=float, default=1.0,
                   help="bytes per weight of the memory bound's reference format (1: int8)")
    p.add_argument("--start-timeout", type=float, default=900.0,
                   help="seconds a server has to answer its first request")
    p.add_argument("--seed", type=int, default=None, help="prompt words (default: new each run)")
    p.add_argument("--rounds", type=int, default=1,
                   help="times the servers take turns (reversed every other round); each row "
                        "reports the median of the rounds (default 1)")
    p.add_argument("--plot", default=None, metavar="PATH", help="draw the table (matplotlib)")
    p.add_argument("--log-dir", default=None, help="keep each server's log here")
    for k in SIZES:
        p.add_argument("--" + k.replace("_", "-"), type=int, default=None,
                       help=f"workload size (default {getattr(Workload(), k)}, quick "
                            f"{getattr(QUICK, k)})")
    return p


def _log(msg: str) -> None:
    print(f"[{NAME}] {msg}", file=sys.stderr, flush=True)


def _in_netns(name: str) -> bool:
    try:
        return os.stat("/proc/self/ns/net").st_ino == os.stat(f"/run/netns/{name}").st_ino
    except OSError:
        return False


def enter_netns(name: str, command: str = NAME) -> None:
    """Re-execute `python -m mimo.bench <command> ...` inside the namespace (servers and
    client then share its loopback); returns only when already inside."""
    if _in_netns(name):
        return
    if not os.path.exists(f"/run/netns/{name}"):
        raise SystemExit(f"{NAME}: no network namespace {name!r}; create it (as root) with "
                         f"`ip netns add {name}; ip netns exec {name} ip link set lo up`, "
                         "or pass --netns none")
    if len(sys.argv) < 2 or sys.argv[1] != command:
        raise SystemExit(f"{command}: --netns needs `python -m mimo.bench {command} ...`")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    _log(f"re-executing inside network namespace {name!r}")
    sys.stderr.flush()
    os.execvp("ip", ["ip", "netns", "exec", name, sys.executable, "-m", "mimo.bench", *sys.argv[1:]])


def _port_free(port: int) -> bool:
    """Nothing listens on it (SO_REUSEADDR, as the servers bind: a closed connection's
    TIME_WAIT does not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _workload(args) -> Workload:
    w = QUICK if args.quick else Workload()
    return replace(w, **{k: getattr(args, k) for k in SIZES if getattr(args, k) is not None})


def _machine_limits(threads: int, quick: bool, *flags: str, timeout: float = 900) -> dict:
    cmd = [sys.executable, "-m", "mimo.bench.machine_limits", "--threads", str(threads), *flags]
    p = subprocess.run(cmd + (["--quick"] if quick else []), capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"machine_limits {' '.join(flags)} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _read_rate(args) -> float:
    """The memory read rate now, GB/s (machine_limits --read-only, a few seconds)."""
    gbs = _machine_limits(args.threads, args.quick, "--read-only", "--reps", "3",
                         timeout=300)["bandwidth_gbs"]
    _log(f"memory read {gbs} GB/s")
    return gbs


def _limits(args, when: str) -> dict:
    _log(f"machine limits on {args.threads} threads, {when} ...")
    m = _machine_limits(args.threads, args.quick)
    _log(f"matmul {m['matmul_gflops']} GFLOP/s, memory {m['bandwidth_gbs']} GB/s "
         f"({m['bandwidth_method']})")
    return m


def _model_config(name: str):
    from ..models.hf_config import model_config_from_hf
    from ..models.registry import resolve
    path = resolve(name)
    if path.is_file():
        from ..models.gguf_loader import gguf_hf_config, open_gguf
        f = open_gguf(path)
        try:
            return model_config_from_hf(gguf_hf_config(f))
        finally:
            f.close()
    return model_config_from_hf(json.loads((path / "config.json").read_text()))


async def _drive(srv: RunningServer, port: int, w: Workload, seed: int, timeout: float) -> dict:
    client = Client(f"http://127.0.0.1:{port}/v1")
    try:
        ready = await wait_ready(client, srv.started, timeout, srv.alive)
        _log(f"{srv.spec.name}: answered after {ready['startup_s']} s; sending the workload")
        load = await run_workload(client, w, seed, lambda m: _log(f"{srv.spec.name}: {m}"))
        return {**ready, "load": load}
    finally:
        await client.aclose()


def _one(spec, args, w: Workload, seed: int, log_path: Path) -> dict:
    missing = spec.missing()
    if missing:
        _log(f"{spec.name}: not installed (missing {', '.join(missing)})")
        return {"status": "not installed", "looked_for": missing}
    if not _port_free(args.port):
        return {"status": "failed", "errors": [f"port {args.port} is in use before the start"]}
    _log(f"{spec.name}: starting ({' '.join(spec.argv)})")
    srv = RunningServer(spec, log_path)
    out: dict = {"status": "failed", "argv": list(spec.argv), "log": str(srv.log_path),
                 "seed": seed}
    try:
        out |= asyncio.run(_drive(srv, args.port, w, seed, args.start_timeout))
        out["status"] = "ok"
        out["errors"] = out["load"].pop("errors")
    except Exception as e:        # noqa: BLE001 - the next server still runs
        out["errors"] = [f"{type(e).__name__}: {e}"]
        out["log_tail"] = srv.log_tail()
        _log(f"{spec.name}: failed: {e}")
    finally:
        out["stop"] = srv.stop()
        out["port_free_after_stop"] = _port_free(args.port)
        _log(f"{spec.name}: stopped in {out['stop']['stop_s']} s, "
             f"leaked pids {out['stop']['leaked_pids'] or 'none'}")
    return out


def combine_rounds(turns: list[dict]) -> dict:
    """One server's record over its turns: the last turn's, every turn's under "rounds"
    (more than one), "ok" only where every turn was, the errors and leaked pids of all of
    them, the start-up the turns' median."""
    if len(turns) == 1:
        return turns[0]
    last = turns[-1]
    out = dict(last, rounds=turns)
    statuses = [t["status"] for t in turns]
    out["status"] = "ok" if all(x == "ok" for x in statuses) else \
        ("failed" if "failed" in statuses else last["status"])
    if any("errors" in t for t in turns):
        out["errors"] = [e for t in turns for e in t.get("errors", [])]
    if all(t.get("startup_s") is not None for t in turns):
        out["startup_s"] = statistics.median(t["startup_s"] for t in turns)
    if all("stop" in t for t in turns):
        out["stop"] = dict(last["stop"], leaked_pids=sorted(
            {p for t in turns for p in t["stop"]["leaked_pids"]}))
    if any("port_free_after_stop" in t for t in turns):
        out["port_free_after_stop"] = all(t.get("port_free_after_stop", True) for t in turns)
    return out


def measure(args) -> dict:
    from .model_cost import Limits, ModelCost
    from .peer_report import compare, summary, table
    peers = [p.strip() for p in args.peers.split(",") if p.strip() not in ("", "none")]
    unknown = set(peers) - set(PEERS)
    if unknown:
        raise SystemExit(f"{NAME}: unknown peer(s) {sorted(unknown)} (known: {', '.join(PEERS)})")
    if args.rounds < 1:
        raise SystemExit(f"{NAME}: --rounds must be >= 1")
    if args.port == 0:
        args.port = free_port()
    w = _workload(args)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    peers_dir = Path(args.peers_dir)
    extra = {"vllm": shlex.split(args.vllm_args), "llama-server": shlex.split(args.llama_args)}
    specs = [peer_spec(p, peers_dir, args.port, tuple(extra[p])) for p in peers]
    if args.model != DEFAULT_MODEL and any(not s.missing() for s in specs):
        raise SystemExit(f"{NAME}: the peers serve {DEFAULT_MODEL}; --model needs --peers none")
    mimo_args = shlex.split(args.mimo_args)
    if args.model != DEFAULT_MODEL:
        mimo_args = ["--model", args.model, *mimo_args]
    cost = ModelCost(_model_config(args.model), weight_bytes=args.weight_bytes)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="mimo-bench-peers-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    specs.append(mimo_spec(args.port, mimo_args, Path(args.mimo_dir).resolve()))
    before = _limits(args, "before the servers")
    turns: dict[str, list[dict]] = {s.name: [] for s in specs}
    rate = _read_rate(args)
    for r in range(args.rounds):
        order = specs if r % 2 == 0 else specs[::-1]
        if args.rounds > 1:
            _log(f"round {r + 1} of {args.rounds}: {', '.join(s.name for s in order)}")
        for s in order:        # round r's prompts: seed + r, the same for every server
            log = log_dir / (f"{s.name}.log" if args.rounds == 1 else f"{s.name}.{r + 1}.log")
            turn = _one(s, args, w, seed + r, log)
            after = _read_rate(args) if turn["status"] != "not installed" else rate
            turn["read_gbs"] = {"before": rate, "after": after}
            turns[s.name].append(turn)
            rate = after
    servers = {n: combine_rounds(t) for n, t in turns.items()}
    machine = best_of(before, _limits(args, "after the servers"))
    lim = Limits(machine["bandwidth_gbs"] * 1e9, machine["matmul_gflops"] * 1e9)
    loads = {n: [t["load"] for t in turns[n]] for n, s in servers.items() if s["status"] == "ok"}
    near = {n: [max(t["read_gbs"].values()) * 1e9 for t in turns[n]] for n in loads}
    rows = table(loads, w, cost, lim, near)
    startup = {n: s.get("startup_s") for n, s in servers.items() if s["status"] == "ok"}
    leaks = {n: s["stop"]["leaked_pids"] for n, s in servers.items() if "stop" in s}
    ok = (all(s["status"] != "failed" and not s.get("errors") for s in servers.values())
          and not any(leaks.values())
          and all(s.get("port_free_after_stop", True) for s in servers.values()))
    return {"bench": NAME, "model": args.model, "quick": args.quick, "seed": seed,
            "rounds": args.rounds,
            "workload": asdict(w), "netns": args.netns, "port": args.port,
            "peers_dir": str(peers_dir), "mimo_dir": str(Path(args.mimo_dir).resolve()),
            "mimo_args": mimo_args, "machine": machine,
            "model_cost": cost.summary(), "servers": servers, "rows": rows,
            "startup": {"values": startup, **compare(startup, higher=False)},
            "summary": summary(rows),
            "single_decode_memory_fraction": {
                n: {"run": (rows["single_decode_tok_s"]["fraction_of_limit"][n] or {}).get("memory"),
                    "turns": rows["single_decode_tok_s"]["memory_fraction_by_turn"][n]}
                for n in loads},
            "leaked_pids": leaks, "ok": ok}


def run(args) -> int:
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        # Before the servers run, not after ten minutes of them.
        raise SystemExit("--plot needs matplotlib (pip install -e '.[bench]')")
    if args.netns != "none":
        enter_netns(args.netns)
    res = measure(args)
    if args.plot:
        from .peer_report import plot
        plot(res, args.plot)
        _log(f"plot: {args.plot}")
    s = res["summary"]
    _log(f"mimo matches or beats the best peer on {s['rows_mimo_matches_or_beats']} of "
         f"{s['rows_compared']} rows (ahead on {s['rows_mimo_ahead']}); ok={res['ok']}")
    print(json.dumps(res), flush=True)
    return 0 if res["ok"] else 1
