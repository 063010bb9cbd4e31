"""Start-up to the first answer of `python server.py` (the default model), per checkout.

    python scripts/startup_time.py [--runs 3] [--port 0] [DIR ...]

Each DIR (default: this checkout; e.g. `git archive <commit> | tar -x -C DIR` for a before)
starts its own server.py with PYTHONPATH=DIR, runs interleaved; the clock runs from the spawn
to the first answered one-token completion, polled every 50 ms (`bench peers` polls every
250 ms). Prints each run (wall seconds, and the server's CPU seconds by then), then the best
and the median per DIR. Other processes on the machine move these numbers by seconds: pause
them (docs/speed.md says how the figures there were taken)."""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _first_answer(port: int, proc: subprocess.Popen, timeout: float) -> None:
    base = f"http://127.0.0.1:{port}"
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            models = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=5).read())
            body = {"model": models["data"][0]["id"], "prompt": "The", "max_tokens": 1,
                    "temperature": 0}
            req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=60).read()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"no answer within {timeout:.0f} s")


def run_once(d: Path, port: int, timeout: float) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(d)}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "server.py", "--port", str(port)], cwd=d, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _first_answer(port, proc, timeout)
        return time.perf_counter() - t0, _cpu_seconds(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="*", default=[str(Path(__file__).resolve().parents[1])])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--port", type=int, default=0, help="0: a free one")
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    dirs = [Path(d).resolve() for d in args.dirs]
    walls: dict[Path, list[float]] = {d: [] for d in dirs}
    for i in range(args.runs):
        for d in dirs:
            wall, cpu = run_once(d, args.port or _free_port(), args.timeout)
            walls[d].append(wall)
            print(f"{d.name}: run {i}: {wall:.2f} s to the first answer, server CPU {cpu:.2f} s, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    for d, w in walls.items():
        print(f"{d.name}: best {min(w):.2f} s, median {statistics.median(w):.2f} s over {len(w)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
