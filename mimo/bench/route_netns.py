"""bench route's third-party routers (sglang-router, vllm-router) and the loopback-only network
namespace they run in.

Some third-party routers try to download tokenizers or models at start; the bench must not
let them reach anything but its own processes. A network namespace has its own loopback, so
everything that talks to a router in one must run in it too. The design: when a third-party
router is to run, the whole bench re-executes itself inside the namespace (`ip netns exec`),
so every router, its workers, Redis and the load client run there alike, on the namespace's
own 127.0.0.1, with no other interface. The namespace is made if absent (`ip netns add NAME`,
loopback up: needs root and iproute2); where it cannot be, the third-party routers are
reported as not run and why, and the rest of the bench runs as usual.

The routers are found at --sglang-router / --vllm-router, else on PATH; they run in
`cache_aware` mode with their own health checks and Prometheus listeners on free loopback
ports. They do not say which worker answered a request, so for them the per-worker request
counts come from the workers' own /metrics, and the share of turns on the previous turn's
worker is not observable (reported as null).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

ENV = "MIMO_BENCH_NETNS"        # set in the re-executed bench (for its processes' logs)
THIRD_PARTY = {"sglang": "sglang-router", "vllm": "vllm-router"}


def find(name: str, given: str | None) -> str | None:
    """The executable of a third-party router (`name`: a key of THIRD_PARTY)."""
    if given:
        return given if os.access(given, os.X_OK) else None
    return shutil.which(THIRD_PARTY[name])


def inside(ns: str) -> bool:
    """Whether this process runs in that namespace (the same network namespace inode)."""
    try:
        return os.stat("/proc/self/ns/net").st_ino == os.stat(f"/run/netns/{ns}").st_ino
    except OSError:
        return False


def links() -> list[str]:
    """The network interfaces this process sees."""
    try:
        return sorted(os.listdir("/sys/class/net"))
    except OSError:
        return []


def ensure(ns: str) -> str | None:
    """Make the namespace (loopback up) if it is absent; None when it is usable, else why
    not."""
    ip = shutil.which("ip")
    if ip is None:
        return "iproute2's ip is not installed"
    try:
        have = subprocess.run([ip, "netns", "list"], capture_output=True, text=True,
                              timeout=10).stdout.split()
        if ns not in have:
            subprocess.run([ip, "netns", "add", ns], check=True, capture_output=True,
                           timeout=10)
        subprocess.run([ip, "netns", "exec", ns, ip, "link", "set", "lo", "up"], check=True,
                       capture_output=True, timeout=10)
        seen = subprocess.run([ip, "netns", "exec", ns, "ls", "/sys/class/net"],
                              capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError) as e:
        err = getattr(e, "stderr", b"") or b""
        return f"cannot set up network namespace {ns!r}: {e} {err.decode(errors='replace')}"
    if seen != ["lo"]:
        return f"network namespace {ns!r} has interfaces besides loopback: {seen}"
    return None


def reexec(ns: str) -> int:
    """Run this same bench command inside the namespace; its exit status."""
    cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "mimo.bench", *sys.argv[1:]]
    return subprocess.call(cmd, env={**os.environ, ENV: ns})


def start_router(name: str, exe: str, workers: list[str], start_timeout: float = 120.0):
    """The third-party router in cache_aware mode on a free 127.0.0.1 port, started and
    answering /health."""
    from .router_process import ExternalRouter
    from .server_process import free_port
    flags = ["--worker-urls", *workers, "--policy", "cache_aware",
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
             "--health-check-interval-secs", "1"]
    return ExternalRouter(exe, ["launch"] if name == "sglang" else [], flags, start_timeout)
