"""A prefill worker and a decode worker (`server.py --role prefill|decode`) as real processes
on 127.0.0.1: the decode worker's answer through the prefill worker's KV equals its own
whole-request answer (the single-worker path) token for token, on the default model and a
tiny MiMo-V2-Flash with attention sinks, prefix cache on and off; usage's cached_tokens is
what the prefill worker reused; the bytes on the wire are the full layers and SWA windows
only; a prefill worker killed mid-transfer becomes a local recompute with the same answer;
pools are whole and idle on both workers afterwards."""
from __future__ import annotations

import os
import signal

import httpx
import pytest
from helpers.api_server import ServerProcess
from helpers.tcp_relay import CuttingRelay

from mimo.disagg import wire

PREFILL_HEADER = "x-mimo-prefill"


@pytest.fixture(scope="module")
def tiny_mimo_dir(tmp_path_factory):
    from mimo.models.tiny import mimo_v2_flash
    d = tmp_path_factory.mktemp("tiny_mimo_pd")
    mimo_v2_flash.write(d, seed=2)
    return str(d)


def _flags(model: str, cache: bool, *extra: str) -> list[str]:
    return ["--model", model, "--dtype", "float32", "--quantize", "none", "--kv-cache-memory",
            "64MiB", "--page-size", "16", "--metrics-public",
            "--prefix-cache" if cache else "--no-prefix-cache", *extra]


def _pair(model: str, cache: bool):
    pre = ServerProcess(*_flags(model, cache, "--role", "prefill"))
    try:
        dec = ServerProcess(*_flags(model, cache, "--role", "decode"))
    except BaseException:
        pre.stop()
        raise
    return pre, dec


def _complete(dec, model, prompt, prefill_url=None, max_tokens=10, logprobs=None):
    """(text, usage, tokens, their logprobs) of a greedy completion; tokens only with
    `logprobs` (which also makes the decode worker sample the first token itself)."""
    headers = {PREFILL_HEADER: prefill_url} if prefill_url else {}
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    if logprobs is not None:
        body["logprobs"] = logprobs
    r = httpx.post(dec.url + "/v1/completions", json=body, headers=headers, timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()
    c = out["choices"][0]
    lp = c.get("logprobs") or {}
    return c["text"], out["usage"], lp.get("tokens"), lp.get("token_logprobs")


def _stats(worker) -> dict:
    return httpx.get(worker.url + "/v1/internal/kv_transfers", timeout=10).json()


def _prompts() -> list[str]:
    base = "The quick brown fox jumps over the lazy dog while the cat sleeps. "
    return [base * 3, base * 3 + "Then", base * 40, "Hello"]


@pytest.mark.parametrize("cache", [True, False], ids=["cache", "nocache"])
@pytest.mark.parametrize("which", ["gemma-3-270m", "tiny-mimo"])
def test_pd_answer_equals_single_worker(which, cache, tiny_mimo_dir):
    model = tiny_mimo_dir if which == "tiny-mimo" else which
    pre, dec = _pair(model, cache)
    try:
        for i, prompt in enumerate(_prompts()):
            ref, ref_usage, _, _ = _complete(dec, model, prompt)        # whole, on one worker
            got, usage, _, _ = _complete(dec, model, prompt, pre.url)   # prefill there
            assert got == ref, (which, cache, i)
            assert usage["completion_tokens"] == ref_usage["completion_tokens"] == 10
            assert usage["prompt_tokens"] == ref_usage["prompt_tokens"]
            n = usage["prompt_tokens"]
            # With logprobs the decode worker computes the last prompt token and samples the
            # first one itself: token for token, and the same log-probabilities.
            _, _, ref_toks, ref_lps = _complete(dec, model, prompt, logprobs=1)
            got2, usage2, toks, lps = _complete(dec, model, prompt, pre.url, logprobs=1)
            assert toks == ref_toks and got2 == ref and len(toks) == 10
            assert all(abs(a - b) < 1e-3 for a, b in zip(lps, ref_lps)), (lps, ref_lps)
            reused = usage2["prompt_tokens_details"]["cached_tokens"]   # the prefill's cache
            if cache:       # the prompt but its last token: whole pages, then the next
                # page's first rows (copied), where at least one whole page matched
                assert reused == (n - 1 if n > 16 else 0), (reused, n)
                if i == 1:  # its first transfer reused prompt 0's pages (its prefix)
                    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
            else:
                assert reused == 0 and usage["prompt_tokens_details"]["cached_tokens"] == 0
        st = _stats(dec)["received"]
        assert st["transfers"] == 2 * len(_prompts()) and st["failed"] == 0
        assert st["recomputed"] == 0
        sent = _stats(pre)["sent"]
        assert sent["wire_bytes"] == st["wire_bytes"] and sent["transfers"] == st["transfers"]
        # The wire carries the tensors plus a small header per request.
        assert 0 < st["wire_bytes"] - st["kv_bytes"] < 4096 * st["transfers"]
        if which == "tiny-mimo":     # window 7 of prompts up to ~600 tokens: a fraction moves
            assert st["bytes_ratio"] < 0.4, st
        for w in (pre, dec):
            w.assert_pools_idle()
    finally:
        pre.stop()
        dec.stop()


def test_killed_prefill_worker_mid_transfer_is_a_local_recompute(tiny_mimo_dir):
    model = tiny_mimo_dir
    pre, dec = _pair(model, True)
    prompt = "The quick brown fox jumps over the lazy dog. " * 30
    relay = None
    try:
        # A relay that passes 20 KB of the KV stream, then SIGKILLs the prefill worker and
        # cuts the connection: the transfer dies between two layers' bytes.
        relay = CuttingRelay(pre.port, cut_after=20_000,
                             on_cut=lambda: os.kill(pre.pid, signal.SIGKILL))
        got, usage, _, _ = _complete(dec, model, prompt, f"http://127.0.0.1:{relay.port}", 12)
        assert relay.cut, "the stream was shorter than the cut: nothing was tested"
        assert not pre.alive() or pre.proc.wait(10) is not None
        ref, _, _, _ = _complete(dec, model, prompt, None, 12)
        assert got == ref and usage["completion_tokens"] == 12
        st = _stats(dec)["received"]
        assert st["failed"] == 1 and st["recomputed"] == 1 and st["transfers"] == 0
        # A dead prefill worker: refused connection, recomputed too.
        got2, _, _, _ = _complete(dec, model, prompt, pre.url, 12)
        assert got2 == ref and _stats(dec)["received"]["recomputed"] == 2
        dec.assert_pools_idle()
    finally:
        if relay is not None:
            relay.stop()
        pre.stop()
        dec.stop()


def test_prefill_endpoint_refuses_bad_bodies(tiny_mimo_dir):
    pre = ServerProcess(*_flags(tiny_mimo_dir, True, "--role", "prefill"))
    try:
        url = pre.url + "/v1/internal/prefill"
        v = wire.VERSION
        for body, status, code in [
                ([1, 2], 400, None), ({"prompt_ids": []}, 400, None),
                ({"prompt_ids": [1, 2], "fingerprint": "x", "wire": v, "extra": 1}, 400, None),
                ({"prompt_ids": [1, 2], "fingerprint": "not-ours", "wire": v}, 409,
                 "kv_layout_mismatch"),
                ({"prompt_ids": [10**9], "fingerprint": "x", "wire": v}, 409,
                 "kv_layout_mismatch"),
                # a decode worker of another wire format (or of none: before the field)
                ({"prompt_ids": [1, 2], "fingerprint": "x"}, 409, "kv_wire_mismatch"),
                ({"prompt_ids": [1, 2], "fingerprint": "x", "wire": v - 1}, 409,
                 "kv_wire_mismatch")]:
            r = httpx.post(url, json=body, timeout=30)
            assert r.status_code == status, (body, r.text)
            assert "error" in r.json()
            if code is not None:
                assert r.json()["error"]["code"] == code, r.text
        assert httpx.get(pre.url + "/health").status_code == 200
        pre.assert_pools_idle()
    finally:
        pre.stop()
