"""A corpus of bad requests against a real server: each gets its exact 4xx status and an
OpenAI-shaped error body, none gets a 5xx, and none disturbs the server or its other
requests (KV pools stay balanced, concurrent streams finish unchanged)."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import httpx
import pytest

MODEL = "gemma-3-270m"
KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON_AUTH = {**AUTH, "Content-Type": "application/json"}
CHAT, COMP, MODELS = "/v1/chat/completions", "/v1/completions", "/v1/models"
ANY = object()          # don't check this field of the error

# A long prompt: ~40k tokens, over the 32k context (tokenizing it takes milliseconds).
LONG = "hello " * 40000
OVER_8MIB = b'{"model": "gemma-3-270m", "prompt": "' + b"a" * (8 * 2**20 + 1024) + b'"}'


def chat(**kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **kw}


def comp(**kw) -> dict:
    return {"model": MODEL, "prompt": "Hello", "max_tokens": 4, **kw}


def drop(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


def user(content) -> dict:
    return chat(messages=[{"role": "user", "content": content}])


@dataclass
class Case:
    id: str
    path: str
    body: object = None            # dict -> JSON; bytes -> sent as is; None -> no body
    status: int = 400
    param: object = ANY            # expected error.param (None, a name, or ANY)
    code: object = ANY             # expected error.code
    says: tuple = ()               # substrings the message must contain (case-insensitive)
    method: str = "POST"
    headers: dict = field(default_factory=lambda: dict(JSON_AUTH))

    def send(self, h: httpx.Client) -> httpx.Response:
        return h.request(self.method, self.path, headers=self.headers, **self._content())

    async def asend(self, h: httpx.AsyncClient) -> httpx.Response:
        return await h.request(self.method, self.path, headers=self.headers, **self._content())

    def _content(self) -> dict:
        if self.body is None:
            return {}
        if isinstance(self.body, bytes):
            return {"content": self.body}
        return {"content": json.dumps(self.body).encode()}


def field_case(id, path, body, param, *says, code=ANY, status=400) -> Case:
    """A rejected field: error.param names it and so does the message."""
    return Case(id, path, body, status, param, code, says or (param,))


def _chunks(data: bytes, n: int = 1 << 16):
    for i in range(0, len(data), n):
        yield data[i:i + n]


CASES = [
    # ---- the body is not a JSON object ---------------------------------------------------
    Case("malformed-json", COMP, b'{"model": "gemma-3-270m", "prompt": "hi",', says=("json",)),
    Case("malformed-json-chat", CHAT, b"{model: gemma, messages: []}", says=("json",)),
    Case("json-array", CHAT, b'[{"model": "gemma-3-270m"}]', says=("json object",)),
    Case("json-string", COMP, b'"just a string"', says=("json object",)),
    Case("json-number", COMP, b"42", says=("json object",)),
    Case("json-null", CHAT, b"null", says=("json object",)),
    Case("invalid-utf8", COMP, b'{"model": "gemma-3-270m", "prompt": "caf\xc3\x28 \xff"}',
         says=("utf-8",)),
    Case("empty-body", CHAT, b"", says=("empty",)),
    Case("whitespace-body", COMP, b" \r\n\t ", says=("empty",)),
    Case("nested-too-deep", COMP, b"[" * 100_000, says=("json", "deep")),
    Case("integer-literal-too-long", COMP,
         b'{"model": "gemma-3-270m", "prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}",
         says=("json",)),
    Case("nan-temperature", COMP, b'{"model": "gemma-3-270m", "prompt": "hi", "temperature": NaN}',
         param="temperature", says=("temperature", "finite")),
    Case("infinite-top-p", COMP, b'{"model": "gemma-3-270m", "prompt": "hi", "top_p": Infinity}',
         param="top_p", says=("top_p",)),
    Case("lone-surrogate-prompt", COMP, b'{"model": "gemma-3-270m", "prompt": "hi \\ud800"}',
         param="prompt", says=("prompt", "unicode")),
    Case("lone-surrogate-content", CHAT,
         b'{"model": "gemma-3-270m", "messages": [{"role": "user", "content": "\\udfff"}]}',
         param="messages", says=("messages[0].content", "unicode")),
    # ---- wrong types ---------------------------------------------------------------------
    field_case("model-int", CHAT, chat(model=123), "model"),
    field_case("model-missing", COMP, drop(comp(), "model"), "model"),
    field_case("model-empty", COMP, comp(model=""), "model"),
    field_case("messages-string", CHAT, chat(messages="Hi"), "messages"),
    field_case("messages-object", CHAT, chat(messages={"role": "user", "content": "Hi"}),
               "messages"),
    field_case("messages-missing", CHAT, drop(chat(), "messages"), "messages"),
    field_case("prompt-int", COMP, comp(prompt=7), "prompt"),
    field_case("prompt-object", COMP, comp(prompt={"text": "Hello"}), "prompt"),
    field_case("prompt-missing", COMP, drop(comp(), "prompt"), "prompt"),
    field_case("prompt-empty", COMP, comp(prompt=""), "prompt", "empty"),
    field_case("prompt-empty-list", COMP, comp(prompt=[]), "prompt"),
    field_case("prompt-two-strings", COMP, comp(prompt=["a", "b"]), "prompt"),
    Case("prompt-token-out-of-vocab", COMP, comp(prompt=[2, 10**9]), says=("token ids",)),
    Case("prompt-token-negative", COMP, comp(prompt=[2, -1]), says=("token ids",)),
    field_case("max-tokens-string", COMP, comp(max_tokens="10"), "max_tokens", "integer"),
    field_case("max-tokens-float", CHAT, chat(max_tokens=1.5), "max_tokens", "integer"),
    field_case("max-tokens-bool", COMP, comp(max_tokens=True), "max_tokens"),
    field_case("temperature-string", CHAT, chat(temperature="hot"), "temperature", "number"),
    field_case("temperature-list", COMP, comp(temperature=[1]), "temperature"),
    field_case("top-p-string", COMP, comp(top_p="high"), "top_p"),
    field_case("top-k-float", COMP, comp(top_k=2.5), "top_k", "integer"),
    field_case("top-k-string", CHAT, chat(top_k="5"), "top_k"),
    field_case("seed-string", COMP, comp(seed="abc"), "seed"),
    field_case("seed-float", CHAT, chat(seed=1.5), "seed", "integer"),
    field_case("seed-over-64-bits", COMP, comp(seed=2**70), "seed"),
    field_case("stream-string", CHAT, chat(stream="yes"), "stream", "boolean"),
    field_case("stream-int", COMP, comp(stream=1), "stream", "boolean"),
    field_case("stop-int", COMP, comp(stop=5), "stop"),
    field_case("stop-list-of-ints", CHAT, chat(stop=[1, 2]), "stop"),
    field_case("stream-options-string", CHAT, chat(stream=True, stream_options="yes"),
               "stream_options"),
    field_case("stream-options-bad-usage", COMP,
               comp(stream=True, stream_options={"include_usage": "yes"}), "stream_options"),
    field_case("ignore-eos-string", COMP, comp(ignore_eos="yes"), "ignore_eos"),
    field_case("stop-token-ids-string", COMP, comp(stop_token_ids="7"), "stop_token_ids"),
    # ---- unknown model, unknown fields ---------------------------------------------------
    field_case("unknown-model-chat", CHAT, chat(model="gpt-4o"), "model", "gpt-4o",
               code="model_not_found", status=404),
    field_case("unknown-model-completions", COMP, comp(model="davinci-002", stream=True),
               "model", "davinci-002", code="model_not_found", status=404),
    # ---- max_tokens / max_completion_tokens / context ------------------------------------
    field_case("max-tokens-negative", COMP, comp(max_tokens=-1), "max_tokens", ">= 1"),
    field_case("max-tokens-zero", CHAT, chat(max_tokens=0), "max_tokens", ">= 1"),
    field_case("max-tokens-huge", COMP, comp(max_tokens=10**9), "max_tokens", "context",
               code="context_length_exceeded"),
    field_case("max-tokens-huge-bigint", CHAT, chat(max_tokens=10**40), "max_tokens", "context",
               code="context_length_exceeded"),
    field_case("max-completion-tokens-zero", CHAT, chat(max_completion_tokens=0),
               "max_completion_tokens", ">= 1"),
    field_case("max-completion-tokens-negative", CHAT, drop(chat(max_completion_tokens=-5),
                                                            "max_tokens"),
               "max_completion_tokens", ">= 1"),
    field_case("max-completion-tokens-huge", CHAT, chat(max_completion_tokens=10**12),
               "max_completion_tokens", "context", code="context_length_exceeded"),
    field_case("max-completion-tokens-string", CHAT, chat(max_completion_tokens="8"),
               "max_completion_tokens", "integer"),
    Case("prompt-over-context", COMP, comp(prompt=LONG), says=("context", "32768")),
    Case("chat-over-context", CHAT, user(LONG), says=("context", "32768")),
    Case("prompt-plus-max-tokens-over-context", COMP,
         comp(prompt="hello " * 30000, max_tokens=5000), says=("context", "max_tokens")),
    Case("token-prompt-over-context", COMP, comp(prompt=[2] * 33000), says=("context",)),
    # ---- messages --------------------------------------------------------------------------
    field_case("messages-empty", CHAT, chat(messages=[]), "messages", "non-empty"),
    field_case("role-unknown", CHAT, chat(messages=[{"role": "wizard", "content": "Hi"}]),
               "messages", "role", "wizard"),
    field_case("role-missing", CHAT, chat(messages=[{"content": "Hi"}]), "messages", "role"),
    field_case("role-int", CHAT, chat(messages=[{"role": 5, "content": "Hi"}]), "messages", "role"),
    field_case("role-tool-without-id", CHAT, chat(messages=[{"role": "tool", "content": "Hi"}]),
               "messages", "tool_call_id"),
    field_case("message-not-object", CHAT, chat(messages=["Hi"]), "messages", "messages[0]"),
    field_case("content-int", CHAT, user(5), "messages", "messages[0].content"),
    field_case("content-object", CHAT, user({"type": "text", "text": "Hi"}),
               "messages", "messages[0].content"),
    field_case("content-missing", CHAT, chat(messages=[{"role": "user"}]),
               "messages", "messages[0].content"),
    field_case("content-part-not-object", CHAT, user(["Hi"]), "messages", "content[0]"),
    field_case("content-part-text-int", CHAT, user([{"type": "text", "text": 5}]),
               "messages", "content[0]"),
    field_case("image-part", CHAT, user([
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]),
        "messages", "image_url", "content[1]"),
    field_case("audio-part", CHAT, user([{"type": "input_audio", "input_audio": {
        "data": "AAAA", "format": "wav"}}]), "messages", "input_audio"),
    Case("roles-not-alternating", CHAT, chat(messages=[{"role": "user", "content": "a"},
                                                       {"role": "user", "content": "b"}]),
         says=("alternate",)),
    # ---- n, stop -------------------------------------------------------------------------
    field_case("n-over-limit", CHAT, chat(n=17), "n", "16"),
    field_case("n-0", COMP, comp(n=0), "n", "[1, 16]"),
    field_case("n-true", COMP, comp(n=True), "n", "integer"),
    field_case("too-many-stop-strings", CHAT, chat(stop=["a", "b", "c", "d", "e"]), "stop", "4"),
    # ---- ranges --------------------------------------------------------------------------
    field_case("temperature-negative", COMP, comp(temperature=-0.1), "temperature", "-0.1"),
    field_case("temperature-too-high", CHAT, chat(temperature=2.5), "temperature", "2.5"),
    field_case("top-p-negative", COMP, comp(top_p=-0.1), "top_p", "-0.1"),
    field_case("top-p-over-one", CHAT, chat(top_p=1.5), "top_p", "1.5"),
    field_case("top-k-below-minus-one", COMP, comp(top_k=-2), "top_k", "-2"),
    # ---- body size -----------------------------------------------------------------------
    Case("body-over-8mib", COMP, OVER_8MIB, status=413, says=("body", "8388608")),
    Case("body-over-8mib-chat", CHAT, OVER_8MIB, status=413, says=("body",)),
    # ---- routes and methods --------------------------------------------------------------
    Case("get-chat", CHAT, method="GET", status=405, param=None, code="method_not_allowed",
         says=("GET", CHAT)),
    Case("get-completions", COMP, method="GET", status=405, param=None, says=("GET",)),
    Case("put-completions", COMP, comp(), method="PUT", status=405, says=("PUT",)),
    Case("delete-models", MODELS, method="DELETE", status=405, says=("DELETE",)),
    Case("post-models", MODELS, {}, status=405, says=("POST",)),
    Case("post-health", "/health", {}, status=405, says=("/health",)),
    Case("unknown-route", "/v1/nope", method="GET", status=404, param=None, code="not_found",
         says=("/v1/nope",)),
    Case("unknown-route-post", "/v1/embeddings", {"model": MODEL, "input": "x"}, status=404,
         code="not_found", says=("/v1/embeddings",)),
    Case("post-root", "/", {}, status=405, says=("POST",)),     # GET / is the chat page
]

# Missing or wrong API keys, on both generation endpoints and /v1/models.
_BAD_AUTH = {
    "missing": {},
    "wrong": {"Authorization": "Bearer not-the-key"},
    "wrong-scheme": {"Authorization": f"Basic {KEY}"},
    "no-scheme": {"Authorization": KEY},
    "empty-bearer": {"Authorization": "Bearer"},
    "key-prefix": {"Authorization": f"Bearer {KEY[:-1]}"},
    "non-ascii": {"Authorization": b"Bearer t\xe9st-key"},
}
for _name, _hdr in _BAD_AUTH.items():
    for _ep, _path, _body, _method in (("chat", CHAT, chat(), "POST"),
                                       ("completions", COMP, comp(), "POST"),
                                       ("models", MODELS, None, "GET")):
        CASES.append(Case(f"auth-{_name}-{_ep}", _path, _body, 401, None,
                          "invalid_api_key", ("api key",), _method,
                          {"Content-Type": "application/json", **_hdr}))
# Auth is checked before anything else: a bad key with a bad body is still a 401.
CASES.append(Case("auth-missing-with-bad-json", CHAT, b"{not json", 401, None, "invalid_api_key",
                  ("api key",), headers={"Content-Type": "application/json"}))
CASES.append(Case("auth-missing-with-huge-body", COMP, OVER_8MIB, 401, None, "invalid_api_key",
                  ("api key",), headers={"Content-Type": "application/json"}))
# Bodies that declare no length: chunked transfer, still capped at 8 MiB.
CASES.append(Case("body-over-8mib-chunked", COMP, None, 413, says=("body",)))

assert len({c.id for c in CASES}) == len(CASES)


def assert_openai_error(r: httpx.Response, case: Case) -> dict:
    where = f"{case.id}: {r.status_code} {r.text[:300]!r}"
    assert r.status_code == case.status, where
    assert r.headers["content-type"].startswith("application/json"), where
    body = r.json()
    assert isinstance(body, dict) and set(body) == {"error"}, where
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, where
    assert isinstance(err["message"], str) and err["message"].strip(), where
    assert isinstance(err["type"], str) and err["type"], where
    assert err["param"] is None or isinstance(err["param"], str), where
    assert err["code"] is None or isinstance(err["code"], str), where
    want_type = "authentication_error" if case.status == 401 else "invalid_request_error"
    assert err["type"] == want_type, where
    if case.param is not ANY:
        assert err["param"] == case.param, where
    if case.code is not ANY:
        assert err["code"] == case.code, where
    for s in case.says:
        assert s.lower() in err["message"].lower(), f"{where}: message should mention {s!r}"
    if case.status == 401:
        assert r.headers.get("www-authenticate") == "Bearer", where
    return err


@pytest.fixture(scope="module")
def h(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def greedy(h: httpx.Client, kind: str, stream: bool = False, **kw) -> tuple[str, str, dict]:
    """(text, finish_reason, usage) of a temperature-0 request."""
    body = (comp if kind == "completions" else chat)(max_tokens=8, temperature=0, **kw)
    path = COMP if kind == "completions" else CHAT
    if not stream:
        r = h.post(path, json=body, headers=AUTH)
        assert r.status_code == 200, r.text
        out = r.json()
        c = out["choices"][0]
        return (c["text"] if kind == "completions" else c["message"]["content"],
                c["finish_reason"], out["usage"])
    body.update(stream=True, stream_options={"include_usage": True})
    text, finish, usage = [], None, None
    with h.stream("POST", path, json=body, headers=AUTH) as r:
        assert r.status_code == 200
        events = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    for e in map(json.loads, events[:-1]):
        assert "error" not in e, e
        if e.get("usage"):
            usage = e["usage"]
        for c in e["choices"]:
            text.append(c["text"] if kind == "completions" else c["delta"].get("content") or "")
            finish = c["finish_reason"] or finish
    return "".join(text), finish, usage


@pytest.fixture(scope="module")
def baseline(h, server):
    """Good answers taken before any bad request, to compare with afterwards."""
    server.assert_pools_idle()
    return {k: greedy(h, k) for k in ("completions", "chat")}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_request(case: Case, h, baseline):
    if case.id == "body-over-8mib-chunked":
        r = h.post(case.path, content=_chunks(OVER_8MIB), headers=case.headers)
        assert "content-length" not in {k.lower() for k in r.request.headers}
    else:
        r = case.send(h)
    assert_openai_error(r, case)


@pytest.mark.parametrize("extra", [
    {"temperature": 1e-300},     # logits / T overflows float32: must mean greedy, not a hang
    {"temperature": 5e-324},
    {"top_p": 0},
    {"top_k": 10**12},
    {"seed": -1},
    {"seed": 2**64 - 1},
    {"stop": ""},
    {"stop_token_ids": [10**12]},
], ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_edge_values_are_served(extra, h, baseline):
    """Valid if unusual values: served (200), never a 5xx and never a wedged engine."""
    r = h.post(COMP, json=comp(max_tokens=3, **extra), headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1
    if "temperature" in extra:   # a vanishing temperature is the greedy limit
        assert r.json()["choices"][0]["text"] == h.post(
            COMP, json=comp(max_tokens=3, temperature=0), headers=AUTH).json()["choices"][0]["text"]


# Fired while good streams decode: a mix of failures at each layer (auth, body, schema,
# model, tokenize + engine admission).
MIDSTREAM_IDS = {
    "malformed-json", "invalid-utf8", "auth-wrong-completions", "unknown-model-chat",
    "image-part", "n-over-limit", "max-tokens-huge", "prompt-over-context", "chat-over-context",
    "prompt-plus-max-tokens-over-context", "token-prompt-over-context",
    "prompt-token-out-of-vocab", "stream-options-bad-usage", "body-over-8mib",
    "roles-not-alternating",
    "nested-too-deep", "lone-surrogate-content", "unknown-model-completions"}
MIDSTREAM = [c for c in CASES if c.id in MIDSTREAM_IDS]
STREAM_PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time"]
STREAM_TOKENS = 16


def test_bad_requests_do_not_disturb_concurrent_streams(h, server, baseline):
    assert len(MIDSTREAM) == len(MIDSTREAM_IDS)

    async def whole(c: httpx.AsyncClient, prompt: str) -> str:
        r = await c.post(COMP, json=comp(prompt=prompt, max_tokens=STREAM_TOKENS, temperature=0,
                                         ignore_eos=True), headers=AUTH)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    async def stream(c: httpx.AsyncClient, prompt: str, started: asyncio.Event):
        body = comp(prompt=prompt, max_tokens=STREAM_TOKENS, temperature=0, ignore_eos=True,
                    stream=True, stream_options={"include_usage": True})
        text, finish, usage, done = [], [], None, False
        async with c.stream("POST", COMP, json=body, headers=AUTH) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                e = json.loads(line[6:])
                assert "error" not in e, e
                if e.get("usage"):
                    usage = e["usage"]
                for ch in e["choices"]:
                    text.append(ch["text"])
                    if ch["finish_reason"]:
                        finish.append(ch["finish_reason"])
                if text:
                    started.set()
        return "".join(text), finish, usage, done

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            # The reference, undisturbed (float32: batch composition changes no token).
            want = await asyncio.gather(*(whole(c, p) for p in STREAM_PROMPTS))
            started = [asyncio.Event() for _ in STREAM_PROMPTS]
            tasks = [asyncio.create_task(stream(c, p, ev))
                     for p, ev in zip(STREAM_PROMPTS, started)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
            before = sum(not t.done() for t in tasks)
            bad = await asyncio.gather(*(case.asend(c) for case in MIDSTREAM))
            return want, await asyncio.gather(*tasks), bad, before

    want, results, bad, before = asyncio.run(main())
    for case, r in zip(MIDSTREAM, bad):
        assert_openai_error(r, case)
    # Every stream had begun and none had ended when the bad requests went out.
    assert before == len(STREAM_PROMPTS)
    for (text, finish, usage, done), w in zip(results, want):
        assert text == w
        assert finish == ["length"] and done
        assert usage["completion_tokens"] == STREAM_TOKENS
    server.assert_pools_idle()


def test_server_is_healthy_after_the_corpus(h, server, baseline):
    for kind in ("completions", "chat"):
        text0, finish0, usage0 = baseline[kind]
        for stream in (False, True):
            text, finish, usage = greedy(h, kind, stream=stream)
            assert (text, finish) == (text0, finish0), (kind, stream)
            for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
                assert usage[k] == usage0[k], (kind, stream, k)
    r = h.get(MODELS, headers=AUTH)
    assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == [MODEL]
    r = h.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    # Not one request of the session was answered with a 5xx.
    metrics = h.get("/metrics", headers=AUTH).text
    statuses = [ln for ln in metrics.splitlines() if ln.startswith("mimo_requests_total{")]
    assert statuses and not [ln for ln in statuses if 'status="5' in ln], statuses
    server.assert_pools_idle()
