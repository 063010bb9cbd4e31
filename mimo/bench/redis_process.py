"""Real Redis servers on free 127.0.0.1 ports, for the benchmarks and the tests that need one.

RedisServer: one `redis-server` (no persistence, its own temp dir) that a test can kill,
restart on the same port, pause (SIGSTOP: it accepts connections and never answers) and
resume. RedisCluster3: three masters (`--cluster-enabled yes`, no replicas) joined with
`redis-cli --cluster create`, ready once every node reports `cluster_state:ok`.

No server outlives the process that started it: callers stop them in `finally`, an atexit
hook stops whatever is left, and each server gets SIGKILL from the kernel if that process
dies (PR_SET_PDEATHSIG). A missing redis-server is an error naming the package to install.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import redis

from .server_process import free_port

_LIVE: set[RedisServer] = set()
_PR_SET_PDEATHSIG = 1


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} not found on PATH (Debian/Ubuntu: apt-get install "
                           "redis-server redis-tools; .ci/run installs them)")
    return path


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class RedisServer:
    def __init__(self, maxmemory: str | None = None, policy: str | None = None,
                 args: tuple[str, ...] = ()):
        self._bin = _binary("redis-server")
        self.dir = tempfile.mkdtemp(prefix="mimo-redis-")
        self.extra = list(args)
        if maxmemory is not None:
            self.extra += ["--maxmemory", maxmemory]
        if policy is not None:
            self.extra += ["--maxmemory-policy", policy]
        self.proc: subprocess.Popen | None = None
        self.port = 0
        _LIVE.add(self)
        try:
            for _ in range(5):      # a free port can be taken before redis binds it
                self.port = free_port()
                if self._start():
                    return
            raise RuntimeError(f"redis-server did not start: {self.log_tail()}")
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self) -> redis.Redis:
        """A raw synchronous client (no retries), for setting up and inspecting."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def _start(self) -> bool:
        argv = [self._bin, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self.dir, "--logfile", "redis.log",
                "--daemonize", "no", *self.extra]
        self.proc = subprocess.Popen(argv, cwd=self.dir, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent)
        end = time.monotonic() + 15
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith((b"+PONG", b"-NOAUTH")):   # up (NOAUTH: a password)
                        return True
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING: "
                           f"{self.log_tail()}")

    def log_tail(self) -> str:
        try:
            with open(os.path.join(self.dir, "redis.log")) as f:
                return "".join(f.readlines()[-10:])
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: the server is gone at once, its connections reset."""
        if self.proc is not None:
            self._signal(signal.SIGKILL)
            self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP: connections are still accepted (by the kernel), nothing is answered."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def restart(self) -> None:
        """A fresh process on the same port (empty: there is no persistence)."""
        self.kill()
        if not self._start():
            raise RuntimeError(f"redis-server did not restart on {self.port}: {self.log_tail()}")

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
        _LIVE.discard(self)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisCluster3:
    """Three masters, no replicas. `cluster-require-full-coverage no`, as storage.py advises,
    so the surviving masters keep serving their slots when one dies."""

    def __init__(self, node_timeout_ms: int = 1000):
        cli = _binary("redis-cli")
        args = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(node_timeout_ms),
                "--cluster-require-full-coverage", "no")
        self.nodes: list[RedisServer] = []
        try:
            for _ in range(3):
                self.nodes.append(RedisServer(args=args))
            subprocess.run([cli, "--cluster", "create", *[n.address for n in self.nodes],
                            "--cluster-replicas", "0", "--cluster-yes"],
                           check=True, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
            self._wait_ok()
            self.slot_owner = self._slot_owners()
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return "redis-cluster://" + ",".join(n.address for n in self.nodes)

    def _wait_ok(self, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            infos = []
            for n in self.nodes:
                with n.client() as c:
                    infos.append(c.execute_command("CLUSTER INFO"))   # parsed into a dict
            if all(i["cluster_state"] == "ok" and int(i["cluster_known_nodes"]) == 3
                   for i in infos):
                return
            time.sleep(0.05)
        raise RuntimeError("the Redis cluster did not reach cluster_state:ok")

    def _slot_owners(self) -> list[int]:
        """Node index of each of the 16384 slots, as CLUSTER SLOTS reports it."""
        owner = [-1] * 16384
        ports = [n.port for n in self.nodes]
        with self.nodes[0].client() as c:
            ranges = c.execute_command("CLUSTER SLOTS")
        for start, end, primary, *_ in ranges:
            for s in range(int(start), int(end) + 1):
                owner[s] = ports.index(int(primary[1]))
        assert -1 not in owner, "slots not covered"
        return owner

    def node_of(self, keys: list[str]) -> list[int]:
        """The index of the master serving each key's slot (CLUSTER KEYSLOT on a live node)."""
        live = next(n for n in self.nodes if n.alive())
        with live.client() as c:
            pipe = c.pipeline(transaction=False)
            for k in keys:
                pipe.execute_command("CLUSTER KEYSLOT", k)
            return [self.slot_owner[int(s)] for s in pipe.execute()]

    def kill(self, i: int) -> None:
        self.nodes[i].kill()

    def pause(self, i: int) -> None:
        self.nodes[i].pause()

    def resume(self, i: int) -> None:
        self.nodes[i].resume()

    def wait_failed(self, i: int, timeout: float = 30.0) -> None:
        """Until every other master flags node i as failed (after cluster-node-timeout)."""
        dead = self.nodes[i].port
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            views = []
            for n in self.nodes:
                if n.port != dead:
                    with n.client() as c:   # parsed: {"host:port": {"flags": ..., ...}}
                        views.append(c.execute_command("CLUSTER NODES"))
            if all(any(addr.split("@")[0].endswith(f":{dead}")
                       and "fail" in node["flags"].split(",") for addr, node in v.items())
                   for v in views):
                return
            time.sleep(0.1)
        raise RuntimeError(f"node {i} was not flagged as failed")

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def __enter__(self) -> RedisCluster3:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop()
