"""A real `python -m mimo.router` process on a free 127.0.0.1 port (bench route, the router
tests), with the same lifetime rules as `server_process.ServerProcess`; plus the metrics
parsing both need."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from .server_process import ROOT, ServerProcess, _die_with_parent, free_port


class LoopbackProcess(ServerProcess):
    """`python ARGS --host 127.0.0.1 --port PORT *flags` (PORT: given, to restart a worker at
    the same URL, or a free one; `exe`: another program than this Python), waited for until
    /health answers 200 (any answer when `need_ok` is False)."""
    def __init__(self, args: list[str], flags: list[str], start_timeout: float = 180.0,
                 port: int | None = None, need_ok: bool = True, wait: bool = True,
                 nice: int = 0, exe: str | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile("w+")
        self.args, self.start_timeout, self.need_ok = args, start_timeout, need_ok
        cmd = [exe or sys.executable, *args, "--host", "127.0.0.1", "--port", str(self.port),
               *flags]
        if nice:
            cmd = ["nice", "-n", str(nice), *cmd]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
        # Started from this thread: the death signal follows the thread that forked.
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL, cwd=str(ROOT),
                                     preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self.pid = self.proc.pid
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        import httpx
        try:
            until = time.time() + self.start_timeout
            while time.time() < until:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.args} exited ({self.proc.returncode}):\n"
                                       f"{self.log_tail()}")
                try:
                    r = httpx.get(self.url + "/health", timeout=2)
                    if r.status_code == 200 or not self.need_ok:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            raise RuntimeError(f"{self.args} did not answer /health in "
                               f"{self.start_timeout:.0f} s:\n{self.log_tail()}")
        except BaseException:
            self.stop()
            raise

    def kill(self) -> None:
        """SIGKILL: a crash, no goodbye."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(15)



class RouterProcess(LoopbackProcess):
    def __init__(self, flags: list[str], start_timeout: float = 120.0, port: int | None = None,
                 need_worker: bool = True):
        super().__init__(["-m", "mimo.router"], flags, start_timeout, port, need_worker)

    def counters(self) -> dict[str, dict[str, float]]:
        return scrape(self.url)


class ExternalRouter(LoopbackProcess):
    """A third-party router's executable (bench/route_netns.py builds its flags)."""
    def __init__(self, exe: str, args: list[str], flags: list[str],
                 start_timeout: float = 120.0):
        super().__init__(args, flags, start_timeout, exe=exe)


class WorkerProcess(LoopbackProcess):
    """`server.py *flags`, at a given port when restarting one."""
    def __init__(self, flags: list[str], start_timeout: float = 180.0, port: int | None = None,
                 wait: bool = True, nice: int = 0):
        super().__init__([str(ROOT / "server.py")], flags, start_timeout, port, wait=wait,
                         nice=nice)


def start_all(make, n: int) -> list:
    """n processes from make(i, wait=False), started together, then waited for."""
    procs = []
    try:
        for i in range(n):
            procs.append(make(i, wait=False))
        for p in procs:
            p.wait_ready()
    except BaseException:
        for p in procs:
            p.stop()
        raise
    return procs


def kill_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(15)


def scrape(url: str) -> dict[str, dict[str, float]]:
    """Router metrics as {name: {first label's value ('' if none): value}}."""
    import httpx
    out: dict[str, dict[str, float]] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if not line.startswith("mimo_router_") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        label = ""
        if "{" in name:
            name, rest = name.split("{", 1)
            label = rest.rstrip("}").split("=", 1)[1].split(",")[0].strip('"')
        d = out.setdefault(name, {})
        d[label] = d.get(label, 0.0) + float(value)
    return out
