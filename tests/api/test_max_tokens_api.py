"""max_tokens left out: as OpenAI, generation may run to the end of the context (the prompt's
length decides, known only once it is tokenized); `--default-max-tokens N` bounds it. Against
the real server on 127.0.0.1 serving a tiny random Gemma 3 with an 80-token context,
ignore_eos so that only the bound can end a request."""
from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
from helpers.api_server import ROOT, ServerProcess

CONTEXT = 80
MODEL = "tiny"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from mimo.models.tiny import gemma3
    d = tmp_path_factory.mktemp("tiny_gemma3_ctx")
    gemma3.write(d, seed=3)
    return d


def _serve(d, *extra):
    return ServerProcess("--model", str(d), "--served-model-name", MODEL, "--dtype", "float32",
                         "--kv-cache-memory", "16MiB", "--max-model-len", str(CONTEXT), *extra)


@pytest.fixture(scope="module")
def servers(tiny_dir):
    rest = _serve(tiny_dir)
    try:
        bounded = _serve(tiny_dir, "--default-max-tokens", "5")
    except BaseException:
        rest.stop()
        raise
    yield {"rest": rest, "bounded": bounded}
    rest.stop()
    bounded.stop()


def _post(server, path, **body):
    return httpx.post(server.url + path, json={"model": MODEL, "temperature": 0,
                                               "ignore_eos": True, **body}, timeout=120)


def test_no_max_tokens_runs_to_the_end_of_the_context(servers):
    s = servers["rest"]
    for path, body in (("/v1/completions", {"prompt": "hello world"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user",
                                                               "content": "hello"}]})):
        r = _post(s, path, **body)
        assert r.status_code == 200, r.text
        u = r.json()["usage"]
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert u["prompt_tokens"] + u["completion_tokens"] == CONTEXT, u
    # a prompt of 78 tokens leaves 2
    ids = list(range(10, 10 + CONTEXT - 2))
    r = _post(s, "/v1/completions", prompt=ids)
    assert r.json()["usage"]["completion_tokens"] == 2, r.text
    # streamed alike, and a bound the client sets is kept
    chunks = httpx.post(s.url + "/v1/completions", timeout=120, json={
        "model": MODEL, "prompt": ids, "stream": True, "ignore_eos": True,
        "stream_options": {"include_usage": True}}).text
    assert '"completion_tokens": 2' in chunks or '"completion_tokens":2' in chunks
    assert _post(s, "/v1/completions", prompt="hello", max_tokens=3).json()[
        "usage"]["completion_tokens"] == 3


def test_min_tokens_over_the_rest_of_the_context_is_a_400(servers):
    r = _post(servers["rest"], "/v1/completions", prompt=list(range(10, 10 + CONTEXT - 2)),
              min_tokens=3)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "min_tokens", r.text
    assert err["code"] == "context_length_exceeded"
    r = _post(servers["rest"], "/v1/completions", prompt=list(range(10, 10 + CONTEXT - 2)),
              min_tokens=2)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_default_max_tokens_flag_bounds_requests_without_one(servers):
    s = servers["bounded"]
    r = _post(s, "/v1/chat/completions", messages=[{"role": "user", "content": "hi"}])
    assert r.json()["usage"]["completion_tokens"] == 5, r.text
    assert _post(s, "/v1/completions", prompt="hi", max_tokens=7).json()[
        "usage"]["completion_tokens"] == 7
    # the flag's bound is still cut to the context's rest
    r = _post(s, "/v1/completions", prompt=list(range(10, 10 + CONTEXT - 2)))
    assert r.json()["usage"]["completion_tokens"] == 2, r.text


def test_no_max_tokens_stops_where_the_kv_budget_ends(tiny_dir):
    """A KV budget that holds less than the 4096-token context: a request without max_tokens
    runs to what the full pool can hold (the engine refuses one that could outgrow an empty
    pool), not a 400; one that asks for more is still refused."""
    s = ServerProcess("--model", str(tiny_dir), "--served-model-name", MODEL, "--dtype",
                      "float32", "--kv-cache-memory", "1MiB")
    try:
        pages = s.pools()["full"]["capacity"]
        held = pages * 16                                   # --page-size 16
        assert held < 4096, held
        r = _post(s, "/v1/completions", prompt="hello")
        assert r.status_code == 200, r.text
        u = r.json()["usage"]
        assert u["prompt_tokens"] + u["completion_tokens"] == held
        assert r.json()["choices"][0]["finish_reason"] == "length"
        r = _post(s, "/v1/completions", prompt="hello", max_tokens=held)
        assert r.status_code == 400, r.text
    finally:
        s.stop()


def test_help_documents_the_flag():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "server.py"), "--help"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0 and "--default-max-tokens" in out.stdout
