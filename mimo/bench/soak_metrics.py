"""soak's view of the server: /metrics parsed, step stalls tracked, fds and threads counted."""
from __future__ import annotations

import asyncio
import contextlib
import os
import time


def parse_metrics(text: str) -> dict[str, list[tuple[dict, float]]]:
    """Prometheus text format -> {sample name: [(labels, value), ...]}."""
    out: dict[str, list[tuple[dict, float]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        labels: dict[str, str] = {}
        if "{" in line:
            name, rest = line.split("{", 1)
            body, _, tail = rest.rpartition("}")
            i = 0
            while i < len(body):
                eq = body.index("=", i)
                key = body[i:eq].strip().lstrip(",").strip()
                j, val = eq + 2, []         # skip ="
                while body[j] != '"':
                    if body[j] == "\\" and j + 1 < len(body):
                        j += 1
                        val.append({"n": "\n"}.get(body[j], body[j]))
                    else:
                        val.append(body[j])
                    j += 1
                labels[key] = "".join(val)
                i = j + 1
            value = tail.split()[0]
        else:
            parts = line.split()
            if len(parts) < 2:
                continue
            name, value = parts[0], parts[1]
        try:
            out.setdefault(name.strip(), []).append((labels, float(value)))
        except ValueError:
            continue
    return out


def metric_sum(m: dict, name: str, **match) -> float | None:
    """Sum of a metric's samples whose labels include `match`; None when it is absent."""
    if name not in m:
        return None
    return sum(v for labels, v in m[name] if all(labels.get(k) == x for k, x in match.items()))


def metric_by(m: dict, name: str, label: str, **match) -> dict[str, float] | None:
    if name not in m:
        return None
    out: dict[str, float] = {}
    for labels, v in m[name]:
        if all(labels.get(k) == x for k, x in match.items()):
            key = labels.get(label, "")
            out[key] = out.get(key, 0.0) + v
    return out


def _num(x: float | None):
    return None if x is None else (int(x) if float(x).is_integer() else round(x, 3))


class StallTracker:
    """Longest interval in which the step counter did not move while the engine had work.
    An interval starts at the last observation where the counter changed (or the engine
    went from idle to busy) and grows with every busy observation of the same count."""

    def __init__(self):
        self.steps = None
        self.since = None          # start of the current no-progress busy interval
        self.max_stall = 0.0

    def observe(self, now: float, steps: float, busy: bool) -> None:
        if self.steps is None or steps != self.steps or not busy:
            self.steps, self.since = steps, (now if busy else None)
            return
        if self.since is None:
            self.since = now
        self.max_stall = max(self.max_stall, now - self.since)

    def current(self, now: float) -> float:
        return 0.0 if self.since is None else now - self.since


# ---- the server -------------------------------------------------------------------------
def count_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def count_threads(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


class Poller:
    """Polls /metrics every 0.5 s: step stalls, the last sample, failed polls."""

    def __init__(self, url: str):
        self.url, self.stall = url, StallTracker()
        self.last: dict = {}
        self.failures = 0
        self.polls = 0
        self.max_gap = 0.0          # longest time between two successful polls
        self.busy = False

    async def run(self, stop: asyncio.Event) -> None:
        import httpx
        last_ok = time.perf_counter()
        async with httpx.AsyncClient(timeout=5.0) as client:
            while not stop.is_set():
                t = time.perf_counter()
                try:
                    r = await client.get(self.url + "/metrics")
                    m = parse_metrics(r.text)
                    now = time.perf_counter()
                    busy = ((metric_sum(m, "mimo_running_requests") or 0)
                            + (metric_sum(m, "mimo_queue_length") or 0)) > 0
                    steps = metric_sum(m, "mimo_engine_steps")
                    if steps is not None:
                        self.stall.observe(now, steps, busy)
                    self.busy = busy
                    self.last, self.polls = m, self.polls + 1
                    self.max_gap = max(self.max_gap, now - last_ok)
                    last_ok = now
                except Exception:  # noqa: BLE001 - a frozen or dead server: counted, not fatal
                    self.failures += 1      # and, if it had work, no step was seen: a stall
                    if self.stall.steps is not None:
                        self.stall.observe(time.perf_counter(), self.stall.steps, self.busy)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, 0.5 - (time.perf_counter() - t)))
