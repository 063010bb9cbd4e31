"""/tokenize and /detokenize honour every field they take (vLLM's: add_special_tokens,
add_generation_prompt, return_token_strs, the tool fields) and refuse the rest with a 400 in
OpenAI's shape naming the field. The expected ids come from the `tokenizers` library that
the GGUF vocabulary was loaded into, asked directly (no mimo encode in between), and the
chat's from what generation reports as its prompt length."""
from __future__ import annotations

import httpx
import pytest
from helpers.api_server import KEY_HEADER
from test_bad_requests import ANY, Case, assert_openai_error

MSGS = [{"role": "user", "content": "Hi there"}]
TEXT = "Hello world, twice: hello world"


@pytest.fixture(scope="module")
def h(server):
    with httpx.Client(base_url=server.url, timeout=60, headers=KEY_HEADER) as c:
        yield c


@pytest.fixture(scope="module")
def backend(gemma_loaded):
    """The raw `tokenizers.Tokenizer` and Gemma's BOS id as the vocabulary spells it."""
    b = gemma_loaded.tokenizer.backend
    return b, b.token_to_id("<bos>")


def tok(h, **body) -> dict:
    r = h.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["count"] == len(out["tokens"]) and out["max_model_len"] > 0
    return out


def test_a_prompt_with_and_without_special_tokens(h, backend):
    b, bos = backend
    plain = b.encode(TEXT, add_special_tokens=False).ids
    assert bos is not None and bos not in plain
    assert tok(h, prompt=TEXT)["tokens"] == [bos] + plain
    assert tok(h, prompt=TEXT, add_special_tokens=True)["tokens"] == [bos] + plain
    assert tok(h, prompt=TEXT, add_special_tokens=False)["tokens"] == plain
    assert tok(h, prompt="", add_special_tokens=False)["tokens"] == []


def test_token_strs_only_when_asked(h, backend):
    b, bos = backend
    assert tok(h, prompt=TEXT)["token_strs"] is None
    out = tok(h, prompt=TEXT, return_token_strs=True)
    assert out["token_strs"] == [b.id_to_token(i) for i in out["tokens"]]
    assert out["token_strs"][0] == "<bos>"
    chat = tok(h, messages=MSGS, return_token_strs=True)
    assert chat["token_strs"] == [b.id_to_token(i) for i in chat["tokens"]]


def test_a_chat_with_and_without_the_generation_prompt(h, client, backend):
    b, bos = backend
    full = tok(h, messages=MSGS)["tokens"]
    r = client.chat.completions.create(model="gemma-3-270m", messages=MSGS, max_tokens=1)
    assert len(full) == r.usage.prompt_tokens and full[0] == bos and full[1] != bos
    assert tok(h, messages=MSGS, add_generation_prompt=True)["tokens"] == full
    bare = tok(h, messages=MSGS, add_generation_prompt=False)["tokens"]
    tail = b.encode("<start_of_turn>model\n", add_special_tokens=False).ids
    assert bare + tail == full
    # The template writes the BOS; add_special_tokens adds the tokenizer's own (vLLM's too).
    assert tok(h, messages=MSGS, add_special_tokens=True)["tokens"] == [bos] + full
    assert tok(h, messages=MSGS, add_special_tokens=False)["tokens"] == full
    # The defaults of the fields that can only be defaults are accepted.
    assert tok(h, messages=MSGS, continue_final_message=False, chat_template=None,
               chat_template_kwargs={}, mm_processor_kwargs=None)["tokens"] == full


def test_detokenize_round_trip(h, backend):
    b, _ = backend
    ids = tok(h, prompt=TEXT)["tokens"]
    r = h.post("/detokenize", json={"model": "gemma-3-270m", "tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": "<bos>" + TEXT}
    assert h.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}


def bad(cid, path, body, param, code=ANY):
    return Case(cid, path, body, param=param, code=code)


CASES = [
    bad("unknown-field", "/tokenize", {"prompt": "x", "temperature": 0}, "temperature",
        "unknown_parameter"),
    bad("unknown-chat-field", "/tokenize", {"messages": MSGS, "echo": True}, "echo",
        "unknown_parameter"),
    bad("prompt-and-messages", "/tokenize", {"prompt": "x", "messages": MSGS}, "prompt"),
    bad("neither", "/tokenize", {"add_special_tokens": False}, "prompt"),
    bad("gen-prompt-with-text", "/tokenize", {"prompt": "x", "add_generation_prompt": False},
        "add_generation_prompt", "unsupported_parameter"),
    bad("tools-with-text", "/tokenize", {"prompt": "x", "tools": []}, "tools"),
    bad("special-string", "/tokenize", {"prompt": "x", "add_special_tokens": "no"},
        "add_special_tokens"),
    bad("special-int", "/tokenize", {"prompt": "x", "add_special_tokens": 0},
        "add_special_tokens"),
    bad("gen-prompt-string", "/tokenize", {"messages": MSGS, "add_generation_prompt": "no"},
        "add_generation_prompt"),
    bad("token-strs-int", "/tokenize", {"prompt": "x", "return_token_strs": 1},
        "return_token_strs"),
    bad("continue-final", "/tokenize", {"messages": MSGS, "continue_final_message": True},
        "continue_final_message", "unsupported_parameter"),
    bad("chat-template", "/tokenize", {"messages": MSGS, "chat_template": "{{ 1 }}"},
        "chat_template", "unsupported_parameter"),
    bad("template-kwargs", "/tokenize", {"messages": MSGS,
                                         "chat_template_kwargs": {"enable_thinking": True}},
        "chat_template_kwargs", "unsupported_parameter"),
    bad("mm-kwargs", "/tokenize", {"messages": MSGS, "mm_processor_kwargs": {"fps": 1}},
        "mm_processor_kwargs", "unsupported_parameter"),
    bad("prompt-int", "/tokenize", {"prompt": 5}, "prompt"),
    bad("prompt-ids", "/tokenize", {"prompt": [1, 2]}, "prompt"),
    bad("detok-unknown", "/detokenize", {"tokens": [1], "skip_special_tokens": True},
        "skip_special_tokens", "unknown_parameter"),
    bad("detok-missing", "/detokenize", {}, "tokens"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_refused_fields(case, h):
    assert_openai_error(case.send(h), case)


# ---- malformed media URLs: a 400 from /tokenize and from chat, never a 500 -----------------
BAD_URLS = ["http://[::1", "http://[not-an-ip]/a.png", "http://a..b/a.png", "http://xn--/a.png",
            "https://example.com:99999/a.png", "file://[::1/a.png"]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_malformed_media_url_is_a_400(url, vlm_strict_server, vlm_dir):
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "What is this?"}]}]
    base = vlm_strict_server.url
    for path, body in (("/tokenize", {"messages": msgs}),
                       ("/v1/chat/completions", {"model": str(vlm_dir), "messages": msgs,
                                                 "max_tokens": 2})):
        r = httpx.post(base + path, json=body, timeout=60)
        err = assert_openai_error(r, Case(url, path, body, param="messages",
                                          code="invalid_media"))
        assert "URL" in err["message"] or "host" in err["message"], err
    ok = httpx.post(base + "/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]},
                    timeout=60)
    assert ok.status_code == 200, ok.text
