"""The servers bench peers compares, and their processes: mimo's server.py from this checkout,
and the peers set up by the peers scripts (vLLM's CPU build, llama.cpp's llama-server) under
a peers directory, each started by its own start script there.

A server runs in a process group of its own (its start script execs it, so the leader is the
server) and dies with the bench (PR_SET_PDEATHSIG). Every process it starts inherits a marker
in its environment, so `stop()` can find what outlived the group's kill wherever it moved
(another session, reparented to init) and say so; it is then killed by pid.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .server_process import ROOT, _die_with_parent

PEERS = ("vllm", "llama-server")
MARKER = "MIMO_BENCH_PEERS_RUN"


@dataclass(frozen=True)
class ServerSpec:
    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    needs: tuple[Path, ...] = ()        # files that must exist for it to be installed

    def missing(self) -> list[str]:
        return [str(p) for p in self.needs if not p.exists()]


def mimo_spec(port: int, extra: list[str], root: Path = ROOT) -> ServerSpec:
    """server.py at its defaults (plus `extra`) from the checkout `root` (default: this one),
    with this python."""
    return ServerSpec("mimo", (sys.executable, str(root / "server.py"), "--host", "127.0.0.1",
                               "--port", str(port), *extra),
                      {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                       "PYTHONPATH": str(root)},
                      (root / "server.py",))


def peer_spec(name: str, peers_dir: Path, port: int, extra: tuple[str, ...] = ()) -> ServerSpec:
    """A peer as its start script runs it (peer-env.sh: offline, no telemetry), `extra`
    appended to the server's flags (the scripts pass "$@" on)."""
    d = peers_dir
    models = d / "models"
    common = (d / "peer-env.sh", models / "gemma3-chat-template.jinja")
    env = {"PEERS": str(d), "PORT": str(port)}
    if name == "vllm":
        return ServerSpec(name, ("bash", str(d / "start-vllm.sh"), *extra), env,
                          (d / "start-vllm.sh", d / "vllm-venv" / "bin" / "python",
                           d / "vllm_cli.py", models / "gemma-3-270m-hf" / "config.json", *common))
    if name == "llama-server":
        return ServerSpec(name, ("bash", str(d / "start-llama-server.sh"), *extra), env,
                          (d / "start-llama-server.sh", d / "llama.cpp-build" / "bin" / "llama-server",
                           models / "gemma-3-270m-q4_k_m.gguf", *common))
    raise ValueError(f"unknown peer {name!r} (known: {', '.join(PEERS)})")


def _env_has(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def marked_pids(token: str) -> list[int]:
    """Live processes (not zombies) whose environment carries this run's marker."""
    marker = f"{MARKER}={token}".encode()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and _env_has(int(d), marker):
            out.append(int(d))
    return out


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


class RunningServer:
    def __init__(self, spec: ServerSpec, log_path: Path):
        self.spec = spec
        self.token = uuid.uuid4().hex
        self.log_path = log_path
        self.log = open(log_path, "wb")
        env = {**os.environ, **spec.env, MARKER: self.token}
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(list(spec.argv), stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        self.pgid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 3000) -> str:
        self.log.flush()
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, grace: float = 60.0, settle: float = 10.0) -> dict:
        """SIGTERM the server, wait; then SIGTERM and SIGKILL what is left of its group; then
        look for any marked process still alive (a leak: reported, and killed by pid).
        `grace`: seconds the server has to exit; `settle`: its group's, after it and after
        the group's SIGTERM. `group_outlived_server`: some of the group was still there
        `settle` seconds after the server exited (then ended by the group's signals)."""
        t0 = time.perf_counter()
        forced = False
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                forced = True
        # The server's own children (vLLM's engine core) get `settle` seconds to follow it.
        until = time.perf_counter() + settle
        while not self.alive() and _group_alive(self.pgid) and time.perf_counter() < until:
            time.sleep(0.1)
        stragglers = not self.alive() and _group_alive(self.pgid)
        for sig, wait in ((signal.SIGTERM, settle), (signal.SIGKILL, 10.0)):
            if not self.alive() and not _group_alive(self.pgid):
                break
            forced = forced or sig == signal.SIGKILL
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                pass
            until = time.perf_counter() + wait
            while time.perf_counter() < until and (self.alive() or _group_alive(self.pgid)):
                time.sleep(0.1)
        if self.alive():
            self.proc.kill()
        self.proc.wait(10)
        leaked = marked_pids(self.token)
        for pid in leaked:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()
        return {"stop_s": round(time.perf_counter() - t0, 3), "exit_code": self.proc.returncode,
                "forced": forced, "group_outlived_server": stragglers, "leaked_pids": leaked}
