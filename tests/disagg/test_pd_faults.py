"""Faults of disaggregated serving with real processes on 127.0.0.1 (tiny MiMo-V2-Flash,
float32): a KV stream that goes silent or is closed mid-payload, a prefill worker SIGKILLed
mid-request, a decode worker SIGKILLed while it receives a transfer, and every worker gone.
The client gets the single worker's greedy answer (a local recompute on the decode worker,
or the router retrying another worker), or one OpenAI-shaped error once no worker is left;
the pools of every surviving worker are whole and idle afterwards. Also the decode worker's
allow-list of prefill workers (--prefill-peer) and the router's dropping of a client's own
x-mimo-prefill header."""
from __future__ import annotations

import socket
import threading

import httpx
import pytest
from helpers.api_server import ServerProcess
from helpers.fault_relay import FaultRelay
from helpers.pd_procs import assert_idle, pd_flags, wait_paired, write_tiny_mimo

from mimo.bench.router_process import RouterProcess, WorkerProcess
from mimo.bench.server_process import free_port

PREFILL_HEADER = "x-mimo-prefill"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_mimo(tmp_path_factory, "tiny_mimo_pd_faults")




@pytest.fixture(scope="module")
def reference(model):
    """A single worker with the same flags: the answers to match."""
    w = ServerProcess(*pd_flags(model))
    yield w
    w.stop()


PROMPTS = [[(7 * i + 3 * j) % 380 + 10 for j in range(300 + 40 * i)] for i in range(6)]


def _post(url: str, model: str, prompt, headers=None, stream=False, max_tokens=12
          ) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    return httpx.post(url + "/v1/completions", json=body, headers=headers or {}, timeout=300)


def _answer(url: str, model: str, prompt, headers=None) -> tuple[str, int]:
    r = _post(url, model, prompt, headers)
    assert r.status_code == 200, r.text
    out = r.json()
    return out["choices"][0]["text"], out["usage"]["completion_tokens"]


def _received(w) -> dict:
    return httpx.get(w.url + "/v1/internal/kv_transfers", timeout=10).json()["received"]




def _openai_error(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"] and err["type"], err


@pytest.fixture(scope="module")
def refs(reference, model):
    return [_answer(reference.url, model, p) for p in PROMPTS]


def test_transfer_path_faults_and_allowed_peers(model, refs):
    pre = WorkerProcess(pd_flags(model, "--role", "prefill"))
    relay = FaultRelay(pre.port)
    dec = None
    try:
        dec = WorkerProcess(pd_flags(model, "--role", "decode", "--kv-transfer-timeout", "3",
                                   "--prefill-peer", relay.url, "--prefill-peer", pre.url))
        # Allow-list: a URL not on it (loopback too, once a list is given) is refused before
        # anything is computed or fetched, in OpenAI's error shape.
        for bad in ["http://127.0.0.1:1", "http://10.255.255.1:8001", "file:///etc/passwd"]:
            _openai_error(_post(dec.url, model, PROMPTS[0], {PREFILL_HEADER: bad}), 403,
                          "prefill_peer_not_allowed")
            _openai_error(_post(dec.url, model, PROMPTS[0], {PREFILL_HEADER: bad}, stream=True), 403,
                          "prefill_peer_not_allowed")
        assert _received(dec)["transfers"] == 0 and _received(dec)["failed"] == 0
        assert _answer(dec.url, model, PROMPTS[0], {PREFILL_HEADER: pre.url}) == refs[0]
        assert _received(dec)["transfers"] == 1
        # The stream goes silent after 3000 bytes: past --kv-transfer-timeout the decode
        # worker recomputes.
        relay.arm("stall", after=3000)
        assert _answer(dec.url, model, PROMPTS[1], {PREFILL_HEADER: relay.url}) == refs[1]
        assert relay.fired.is_set()
        st = _received(dec)
        assert (st["failed"], st["recomputed"], st["transfers"]) == (1, 1, 1)
        # The prefill side closes the stream mid-payload (the worker stays up).
        relay.arm("cut", after=5000)
        assert _answer(dec.url, model, PROMPTS[2], {PREFILL_HEADER: relay.url}) == refs[2]
        assert relay.fired.is_set() and pre.alive()
        st = _received(dec)
        assert (st["failed"], st["recomputed"], st["transfers"]) == (2, 2, 1)
        # The path works again afterwards, through the relay.
        assert _answer(dec.url, model, PROMPTS[3], {PREFILL_HEADER: relay.url}) == refs[3]
        assert _received(dec)["transfers"] == 2
        assert_idle(pre, dec)
    finally:
        relay.stop()
        for w in (dec, pre):
            if w is not None:
                w.stop()


class _Listener:
    """Counts connections to a loopback port (a URL nobody should contact)."""
    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            c.close()


def test_killed_workers_behind_the_router(model, refs):
    pre = WorkerProcess(pd_flags(model, "--role", "prefill"))
    relay = FaultRelay(pre.port)
    d2_port = free_port()
    d1 = d2 = rt = None
    listener = _Listener()
    try:
        d1 = WorkerProcess(pd_flags(model, "--role", "decode"))     # default: loopback peers
        rt = RouterProcess(["--model", model, "--health-interval", "0.3", "--prefill",
                            relay.url, "--decode", d1.url, "--decode",
                            f"http://127.0.0.1:{d2_port}"])
        # A client's own x-mimo-prefill is dropped: the router names only its --prefill.
        r = _post(rt.url, model, PROMPTS[0], {PREFILL_HEADER: listener.url})
        assert r.status_code == 200 and (r.json()["choices"][0]["text"], 12) == refs[0]
        assert r.headers[PREFILL_HEADER] == relay.url and listener.accepted == 0
        # The decode worker is SIGKILLed while it receives the KV: it never answered, so the
        # router tries another worker (no other decode worker is up: the prefill worker
        # serves the request whole).
        relay.arm("cut", after=4000, on_fault=d1.kill)
        r = _post(rt.url, model, PROMPTS[1])
        assert relay.fired.is_set() and not d1.alive()
        assert r.status_code == 200, r.text
        assert (r.json()["choices"][0]["text"], 12) == refs[1]
        assert r.headers["x-mimo-worker"] == relay.url
        assert_idle(pre)
        # A second decode worker comes up; the prefill worker is SIGKILLed once it has the
        # request and before it answers: the decode worker recomputes.
        d2 = WorkerProcess(pd_flags(model, "--role", "decode"), port=d2_port)
        wait_paired(rt.url, model, relay.url, d2.url, PROMPTS[0])
        relay.arm("kill", on_fault=pre.kill)
        r = _post(rt.url, model, PROMPTS[2], stream=True)
        assert relay.fired.is_set() and not pre.alive()
        text = "".join(ev["choices"][0]["text"] for ev in _events(r) if ev.get("choices"))
        assert (text, r.headers["x-mimo-worker"]) == (refs[2][0], d2.url)
        assert _received(d2)["recomputed"] == 1
        # With the prefill role gone, requests go whole to the decode worker.
        assert _answer(rt.url, model, PROMPTS[3]) == refs[3]
        assert_idle(d2)
        # The last worker dies: one clean error, streamed or not.
        d2.kill()
        for stream in (False, True):
            _openai_error(_post(rt.url, model, PROMPTS[4], stream=stream), 503, "no_worker")
    finally:
        relay.stop()
        listener.sock.close()
        for p in (rt, d2, d1, pre):
            if p is not None:
                p.stop()


def _events(r: httpx.Response) -> list[dict]:
    import json
    assert r.status_code == 200, r.text
    lines = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]" and not any('"error"' in ln for ln in lines)
    return [json.loads(ln) for ln in lines[:-1]]


def test_speculative_decoding_is_refused_with_a_pd_role(model):
    import subprocess
    import sys

    from mimo.bench.server_process import ROOT
    for role in ("prefill", "decode"):
        p = subprocess.run([sys.executable, str(ROOT / "server.py"), *pd_flags(model),
                            "--role", role, "--speculative", "ngram", "--port", "0"],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode != 0
        assert "speculative decoding is not split between workers" in p.stderr + p.stdout
