"""Clients that go away: a non-streaming request whose client times out, and a stream that
disconnects before its first token (during a long prefill), free their KV within about one
engine step of the disconnect, checked through the pool accounting in /metrics; the
request is counted as aborted by its client (499), never as a 200."""
import time

import httpx
from helpers.api_server import API_KEY, KEY_HEADER

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _metric(server, name: str) -> float:
    total = 0.0
    for line in httpx.get(server.url + "/metrics", timeout=10, headers=KEY_HEADER).text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _wait_freed(server, limit: float = 30.0) -> dict:
    """Poll until no page is in use; returns the pools then (with the engine's step count)."""
    deadline = time.time() + limit
    while time.time() < deadline:
        p = server.pools()
        if all(v["in_use"] == 0 for k, v in p.items() if k != "steps"):
            return p
        time.sleep(0.01)
    raise AssertionError(f"KV still in use {limit} s after the client left: {server.pools()}")


def _assert_freed_and_counted(server, aborted0: float) -> None:
    """Right after the client left: its KV is freed at the next step after the disconnect
    is seen (allow one step in flight and one for the scrape racing it), not at the end of
    its generation; and it is counted once as aborted by its client."""
    left = server.pools()["steps"]
    p = _wait_freed(server)
    assert p["steps"] - left <= 3, (left, p["steps"])
    server.assert_pools_idle()
    deadline = time.time() + 5
    while _metric(server, "mimo_requests_aborted_total") < aborted0 + 1 and time.time() < deadline:
        time.sleep(0.05)
    assert _metric(server, "mimo_requests_aborted_total") == aborted0 + 1


def _prompt(n: int, salt: int) -> list[int]:
    return [1000 + (salt * 7919 + i * 104729) % 200_000 for i in range(n)]


def test_non_streaming_client_that_times_out_frees_its_kv(server):
    server.assert_pools_idle()
    aborted0 = _metric(server, "mimo_requests_aborted_total")
    ok0 = _metric(server, 'mimo_requests_total{endpoint="completions",status="200"}')
    body = {"model": "gemma-3-270m", "prompt": _prompt(64, 1), "max_tokens": 1500,
            "ignore_eos": True, "temperature": 0}
    try:
        httpx.post(server.url + "/v1/completions", json=body, headers=AUTH, timeout=1.5)
        raise AssertionError("1500 tokens in 1.5 s: the test cannot observe an abort")
    except httpx.ReadTimeout:
        pass
    _assert_freed_and_counted(server, aborted0)
    assert _metric(server, 'mimo_requests_total{endpoint="completions",status="200"}') == ok0


def test_stream_that_leaves_before_its_first_token_frees_its_kv(server):
    server.assert_pools_idle()
    aborted0 = _metric(server, "mimo_requests_aborted_total")
    # A long prompt: the first token is seconds away (prefill in chunks of the step budget).
    body = {"model": "gemma-3-270m", "prompt": _prompt(6000, 2), "max_tokens": 8,
            "temperature": 0, "stream": True}
    t0 = time.time()
    try:
        with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=AUTH,
                          timeout=0.8) as r:
            for _ in r.iter_bytes():
                raise AssertionError("headers and a token within 0.8 s of a 6000-token prompt")
    except httpx.ReadTimeout:
        pass
    assert time.time() - t0 < 5
    _assert_freed_and_counted(server, aborted0)
    # The server still serves.
    r = httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=60,
                   json={"model": "gemma-3-270m", "prompt": "Hello", "max_tokens": 2})
    assert r.status_code == 200


def test_stream_that_leaves_mid_answer_is_freed_and_counted_once(server):
    """Closing the connection between two tokens cancels the response while it waits for
    the next one: the request is still freed and counted as aborted (499), not lost."""
    server.assert_pools_idle()
    aborted0 = _metric(server, "mimo_requests_aborted_total")
    gone0 = _metric(server, 'mimo_requests_total{endpoint="chat",status="499"}')
    body = {"model": "gemma-3-270m", "max_tokens": 1500, "ignore_eos": True, "temperature": 0,
            "stream": True, "messages": [{"role": "user", "content": "Tell a long story."}]}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=AUTH,
                      timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
    _assert_freed_and_counted(server, aborted0)
    assert _metric(server, 'mimo_requests_total{endpoint="chat",status="499"}') == gone0 + 1



def test_responses_stream_that_leaves_mid_answer_is_counted_once(server):
    server.assert_pools_idle()
    aborted0 = _metric(server, "mimo_requests_aborted_total")
    gone0 = _metric(server, 'mimo_requests_total{endpoint="responses",status="499"}')
    body = {"model": "gemma-3-270m", "input": "Tell a long story.", "max_output_tokens": 1500,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, headers=AUTH,
                      timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(12):
            next(lines)
    _assert_freed_and_counted(server, aborted0)
    assert _metric(server, 'mimo_requests_total{endpoint="responses",status="499"}') == gone0 + 1
