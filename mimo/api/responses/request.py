"""A /v1/responses body -> `ResponsesRequest`: the Responses fields checked here (errors name
them as the Responses API does), everything that shapes generation translated into a chat
completions body that `schemas.parse("chat", ...)` then checks and runs as chat does:
tools (Responses' flat function tools -> chat's), tool_choice, `text.format` (-> chat's
response_format, so json_schema goes through the same grammar), max_output_tokens, sampling.

Unknown fields are a 400 here (as OpenAI answers), and a known field this server cannot
honour is a 400 naming it, never ignored.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import bad_request
from ..fields import boolean, kind_of, number, obj, string
from .items import parse_input

# Responses fields, by what happens to them.
_OWN = {"model", "input", "instructions", "previous_response_id", "store", "stream",
        "stream_options", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
        "temperature", "top_p", "text", "reasoning", "metadata", "user", "safety_identifier",
        "include", "truncation", "service_tier", "background", "top_logprobs",
        "max_tool_calls"}
# mimo's sampling extensions and the cache scope (as chat completions takes them: its checks
# and errors): passed on unchanged.
_PASSED = ("seed", "top_k", "min_p", "repetition_penalty", "presence_penalty",
           "frequency_penalty", "stop", "min_tokens", "ignore_eos", "logit_bias",
           "stop_token_ids", "prompt_cache_key", "cache_salt")
# Known Responses features this server does not have: any value but null is a 400.
_ABSENT = ("conversation", "prompt", "context_management", "moderation", "image",
           "access_programs", "background_options", "prompt_cache_options",
           "prompt_cache_retention")
KNOWN = frozenset(_OWN | set(_PASSED) | set(_ABSENT))
# Known, honoured only at these values.
_ONLY = {"background": (None, False), "truncation": (None, "disabled"),
         "service_tier": (None, "auto", "default"), "max_tool_calls": (None,)}
LOGPROBS = "message.output_text.logprobs"       # the one `include` value honoured
MAX_TOP_LOGPROBS = 20


@dataclass
class ResponsesRequest:
    model: str
    items: list[dict]                   # this turn's input items, normalized
    chat: dict                          # the chat completions body, less its messages
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    instructions: str | None = None
    logprobs: bool = False              # output_text parts and deltas carry logprobs
    echo: dict = field(default_factory=dict)   # request fields the Response object repeats


def _fields(body: dict) -> None:
    unknown = sorted(k for k in body if k not in KNOWN)
    if unknown:
        raise bad_request(f"unknown parameter '{unknown[0][:64]}' for /v1/responses",
                          unknown[0][:64], "unknown_parameter")
    for name in _ABSENT:
        if body.get(name) is not None:
            raise bad_request(f"'{name}' is not supported by this server", name,
                              "unsupported_parameter")
    for name, ok in _ONLY.items():
        v = body.get(name)
        if not any(v == o and type(v) is type(o) for o in ok):
            raise bad_request(f"'{name}' is not supported by this server (got "
                              f"{str(v)[:40]!r}); allowed: {', '.join(map(repr, ok))}",
                              name, "unsupported_parameter")


def _tool(t, i: int) -> tuple[dict, dict]:
    """(the chat tool, the Responses tool as the Response repeats it)."""
    where = f"tools[{i}]"
    if not isinstance(t, dict):
        raise bad_request(f"'{where}' must be an object, got {kind_of(t)}", "tools")
    if t.get("type") != "function":
        shown = t.get("type")
        raise bad_request(f"'{where}.type' {str(shown)[:40]!r} is not supported; this server "
                          f"takes function tools only", "tools")
    extra = sorted(set(t) - {"type", "name", "description", "parameters", "strict"})
    if extra:
        raise bad_request(f"'{where}.{extra[0][:40]}' is not supported", "tools")
    strict = t.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request(f"'{where}.strict' must be a boolean", "tools")
    strict = True if strict is None else strict        # the Responses API's default
    fn = {"name": t.get("name"), "description": t.get("description") or "",
          "parameters": t.get("parameters") or {"type": "object", "properties": {}},
          "strict": strict}
    return {"type": "function", "function": fn}, {"type": "function", **fn}


def _tool_choice(c):
    if c is None or isinstance(c, str):
        return c
    if isinstance(c, dict) and c.get("type") == "function" and set(c) <= {"type", "name"}:
        return {"type": "function", "function": {"name": c.get("name")}}
    raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or "
                      "{\"type\": \"function\", \"name\": ...}", "tool_choice")


def _text_format(body: dict) -> tuple[dict | None, dict]:
    """(chat's response_format, the `text` the Response repeats)."""
    text = obj(body, "text")
    if text is None:
        return None, {"format": {"type": "text"}}
    extra = sorted(set(text) - {"format", "verbosity"})
    if extra:
        raise bad_request(f"'text.{extra[0][:40]}' is not supported", "text")
    if text.get("verbosity") not in (None, "medium"):
        raise bad_request("'text.verbosity' other than 'medium' is not supported", "text")
    f = text.get("format") or {"type": "text"}
    if not isinstance(f, dict):
        raise bad_request(f"'text.format' must be an object, got {kind_of(f)}", "text")
    t = f.get("type")
    if t in ("text", "json_object"):
        return {"type": t}, {"format": {"type": t}}
    if t != "json_schema":
        raise bad_request("'text.format.type' must be 'text', 'json_object' or 'json_schema'",
                          "text")
    js = {k: f[k] for k in ("name", "schema", "strict", "description") if k in f}
    extra = sorted(set(f) - set(js) - {"type"})
    if extra:
        raise bad_request(f"'text.format.{extra[0][:40]}' is not supported", "text")
    return {"type": "json_schema", "json_schema": js}, {"format": dict(f)}


def _logprobs(body: dict) -> tuple[bool, int | None]:
    """(logprobs on, top_logprobs): on with include ["message.output_text.logprobs"] or a
    top_logprobs above 0."""
    inc = body.get("include")
    if inc is not None and (not isinstance(inc, list) or any(v != LOGPROBS for v in inc)):
        bad = next((v for v in inc if v != LOGPROBS), inc) if isinstance(inc, list) else inc
        raise bad_request(f"'include' value {str(bad)[:60]!r} is not supported; this server "
                          f"takes only {LOGPROBS!r}", "include", "unsupported_parameter")
    top = number(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS, integer=True)
    return bool(inc) or bool(top), top


def _reasoning(body: dict) -> None:
    r = obj(body, "reasoning")
    if r is not None and any(v is not None for v in r.values()):
        raise bad_request("'reasoning' options (effort, summary) are not supported: the model "
                          "reasons as it was trained to, and its reasoning comes back as "
                          "reasoning items", "reasoning")


def parse_request(body) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    _fields(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request(f"'model' is required and must be a string, got {kind_of(model)}",
                          "model")
    stream = boolean(body, "stream", False)
    so = obj(body, "stream_options")
    if so is not None and (not stream or any(v not in (None, False) for v in so.values())):
        raise bad_request("'stream_options' is only allowed with stream: true, and no option "
                          "(include_obfuscation) is supported", "stream_options")
    _reasoning(body)
    md = obj(body, "metadata")
    if md is not None and (len(md) > 16 or not all(isinstance(v, str) for v in md.values())):
        raise bad_request("'metadata' takes at most 16 string values", "metadata")
    for name in ("user", "safety_identifier"):
        string(body, name)
    mot = number(body, "max_output_tokens", None, 1, integer=True)
    raw_tools = body.get("tools") or []
    if not isinstance(raw_tools, list):
        raise bad_request(f"'tools' must be an array, got {kind_of(raw_tools)}", "tools")
    tools = [_tool(t, i) for i, t in enumerate(raw_tools)]
    fmt, text = _text_format(body)
    lp, top = _logprobs(body)
    chat = {"model": model, "max_tokens": mot, "temperature": body.get("temperature"),
            "top_p": body.get("top_p"), "tools": [t[0] for t in tools] or None,
            "tool_choice": _tool_choice(body.get("tool_choice")),
            "parallel_tool_calls": body.get("parallel_tool_calls"), "response_format": fmt,
            "logprobs": lp or None, "top_logprobs": top if lp else None,
            **{k: body[k] for k in _PASSED if k in body}}
    chat = {k: v for k, v in chat.items() if v is not None}
    echo = {"tools": [t[1] for t in tools], "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": boolean(body, "parallel_tool_calls", True), "text": text,
            "max_output_tokens": mot, "temperature": number(body, "temperature", 1.0),
            "top_p": number(body, "top_p", 1.0), "metadata": md or {},
            "user": body.get("user"), "safety_identifier": body.get("safety_identifier"),
            "prompt_cache_key": body.get("prompt_cache_key"), "top_logprobs": top}
    prev = string(body, "previous_response_id", nonempty=True)
    return ResponsesRequest(model, parse_input(body.get("input")), chat, stream,
                            boolean(body, "store", True), prev,
                            string(body, "instructions"), lp, echo)


# chat's parameter names -> the Responses API's, for errors raised by chat's parser.
CHAT_PARAM = {"messages": "input", "prompt": "input", "max_tokens": "max_output_tokens",
              "max_completion_tokens": "max_output_tokens", "response_format": "text"}


def rename_params(message: str) -> str:
    for a, b in (("'max_tokens'", "'max_output_tokens'"), ("'response_format", "'text.format"),
                 ("messages[", "the prompt's message [")):
        message = message.replace(a, b)
    return message
