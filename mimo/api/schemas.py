"""OpenAI request bodies -> validated `GenerationSpec`. Every field mimo knows is honoured or
rejected with a 400 naming it (`param`): a field of the other endpoint (chat's `tools` sent
to /v1/completions, completions' `echo` sent to chat) is such a 400, never ignored. A field
mimo does not know at all is ignored and logged (routers and SDKs add their own;
OpenAI itself would answer 400). Type and range checks follow OpenAI's reference."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..engine.sampling_params import SamplingParams
from ..kvcache.radix.namespace import CacheScope, check_scope_string
from ..multimodal.item import MediaItem
from ..structured.request import GrammarRequest
from .content import valid_unicode
from .errors import APIError, bad_request
from .fields import boolean, kind_of, obj, string
from .messages import parse_messages
from .params import Choices, choices, max_tokens, sampling_params
from .response_format import parse_response_format
from .tools import ToolSpec, forced_call, parse_tools

log = logging.getLogger("mimo.api")

MAX_STOP = 4
_COMMON = {"model", "stream", "stream_options", "n", "max_tokens", "temperature", "top_p",
           "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "min_tokens",
           "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias",
           "logprobs", "user", "metadata", "store", "service_tier", "cache_salt",
           "prompt_cache_key"}
_CHAT_ONLY = {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
         "functions", "function_call", "parallel_tool_calls", "response_format", "modalities",
         "audio", "prediction", "reasoning_effort", "web_search_options"}
_COMPLETION_ONLY = {"prompt", "echo", "suffix", "best_of"}
# The fields each endpoint knows: one table per endpoint.
FIELDS = {"chat": frozenset(_COMMON | _CHAT_ONLY),
          "completion": frozenset(_COMMON | _COMPLETION_ONLY)}
_PATH = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
# Known and impossible to honour here: any value but these is a 400 naming the field.
_ONLY = {"audio": (None,), "prediction": (None,), "web_search_options": (None,),
         "reasoning_effort": (None,), "store": (None, False),
         "service_tier": (None, "auto", "default")}


@dataclass
class GenerationSpec:
    kind: str                          # 'chat' or 'completion'
    model: str
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)
    messages: list[dict] | None = None
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    # Images and videos of the chat, in prompt order; their places in `messages` are
    # {"type": "image"|"video"} parts.
    media: list[MediaItem] = field(default_factory=list)
    choices: Choices = field(default_factory=lambda: Choices(1, 1, None))
    echo: bool = False
    # No max_tokens was sent: params.max_tokens is a cap that generation cuts to the rest of
    # the context once the prompt's length is known.
    fit_max_tokens: bool = False
    tools: ToolSpec | None = None
    grammar: GrammarRequest | None = None   # response_format or a forced tool choice
    json_mode: str | None = None            # 'json_object' | 'json_schema' (response_format)
    cache: CacheScope = CacheScope()        # cache_salt and prompt_cache_key

    @property
    def n(self) -> int:
        return self.choices.n


def _stop(body) -> list[str]:
    s = body.get("stop")
    if s is None:
        return []
    if isinstance(s, str):
        s = [s]
    if not isinstance(s, list) or not all(isinstance(x, str) for x in s):
        raise bad_request("'stop' must be a string or a list of strings", "stop")
    if len(s) > MAX_STOP:
        raise bad_request(f"'stop' takes at most {MAX_STOP} strings", "stop")
    return [x for x in s if x]


def _unsupported(body: dict) -> None:
    for name, ok in _ONLY.items():
        v = body.get(name)
        if not any(v is o or (isinstance(o, str) and v == o) for o in ok):
            raise bad_request(f"'{name}' is not supported by this server (got "
                              f"{str(v)[:40]!r}); allowed: {', '.join(map(repr, ok))}", name)
    mods = body.get("modalities")
    if mods is not None and mods != ["text"]:
        raise bad_request("'modalities' must be [\"text\"]: this server generates text only",
                          "modalities")
    string(body, "user")
    md = obj(body, "metadata")
    if md is not None and (len(md) > 16 or not all(isinstance(v, str) for v in md.values())):
        raise bad_request("'metadata' takes at most 16 string values", "metadata")


def _stream_options(body: dict, stream: bool) -> bool:
    so = body.get("stream_options")
    if so is None:
        return False
    if not stream:
        raise bad_request("'stream_options' is only allowed with 'stream': true",
                          "stream_options")
    if not isinstance(so, dict) or not isinstance(so.get("include_usage", False), bool):
        raise bad_request("'stream_options' must be an object like {\"include_usage\": true}",
                          "stream_options")
    return bool(so.get("include_usage"))


def _prompt(spec: GenerationSpec, body: dict) -> None:
    p = body.get("prompt")
    if isinstance(p, str):
        if not p:
            raise bad_request("'prompt' is empty", "prompt")
        spec.prompt = valid_unicode(p, "'prompt'", "prompt")
    elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool)
                                           for t in p):
        spec.prompt_ids = list(p)
    elif isinstance(p, list) and len(p) == 1 and isinstance(p[0], str) and p[0]:
        spec.prompt = valid_unicode(p[0], "'prompt'", "prompt")
    else:
        raise bad_request("'prompt' must be a non-empty string, one string in a list, or a "
                          "list of token ids", "prompt")
    spec.echo = boolean(body, "echo", False)
    if spec.echo and spec.choices.logprobs is not None:
        raise bad_request("'echo' with 'logprobs' (prompt logprobs) is not supported", "echo")
    suffix = string(body, "suffix")
    if suffix:
        raise bad_request("'suffix' (fill-in-the-middle) is not supported by this model",
                          "suffix")


def cache_scope(body: dict) -> CacheScope:
    """`cache_salt` and `prompt_cache_key`: each absent or a string of 1 to 256 characters."""
    got = {}
    for name in ("cache_salt", "prompt_cache_key"):
        try:
            got[name] = check_scope_string(body.get(name), name)
        except ValueError as e:
            raise bad_request(str(e), name) from None
        string(body, name)      # (lone surrogates)
    return CacheScope(got["cache_salt"], got["prompt_cache_key"])


def _fields(kind: str, body: dict) -> None:
    """A field of the other endpoint is a 400 naming it; one neither knows is logged."""
    known = FIELDS[kind]
    other = "completion" if kind == "chat" else "chat"
    misplaced = sorted(k for k in body if k not in known and k in FIELDS[other])
    if misplaced:
        name = misplaced[0]
        raise bad_request(f"'{name}' is a field of {_PATH[other]}, not of {_PATH[kind]}",
                          name, "unsupported_parameter")
    unknown = sorted(set(body) - known - FIELDS[other])
    if unknown:
        log.info("ignoring unknown request field(s): %s", ", ".join(unknown)[:200])


def _chat(spec: GenerationSpec, body: dict, multimodal: bool, tool_format) -> None:
    spec.messages = parse_messages(body.get("messages"), multimodal, spec.media)
    spec.tools = parse_tools(body)
    spec.grammar, spec.json_mode = parse_response_format(body)
    tools = spec.tools
    if tools is None or spec.grammar is None or tools.choice == "none":
        pass
    elif tools.forced:
        raise bad_request("a forced tool_choice and a JSON 'response_format' cannot both "
                          "constrain the output", "response_format")
    else:   # auto: a JSON grammar forbids the call's prefix, so no tool could be called
        raise bad_request("'response_format' json with 'tools' under tool_choice 'auto' "
                          "would keep the model from calling any tool; send tool_choice "
                          "'none' (JSON answer) or drop 'response_format'", "response_format")
    if tools is not None and tools.forced:
        if tool_format is None:
            raise TypeError("schemas.parse: a forced tool_choice needs the model's "
                            "tool_format")
        spec.grammar = forced_call(tool_format, tools.forced)


def parse(kind: str, body: Any, max_model_len: int, multimodal: bool = False,
          vocab_size: int = 2**31, tool_format=None,
          default_max_tokens: int | None = None) -> GenerationSpec:
    """`multimodal`: the model takes image_url / video_url parts (else they are a 400).
    `tool_format`: the model family's mimo.tools.ToolFormat (needed by forced tool choices).
    `default_max_tokens`: the bound of a request that sends none (None: the context's rest)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    _fields(kind, body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request(f"'model' is required and must be a string, got {kind_of(model)}",
                          "model")
    stream = boolean(body, "stream", False)
    include_usage = _stream_options(body, stream)
    _unsupported(body)
    ch = choices(kind, body, stream)
    mt, fit = max_tokens(body, kind, max_model_len, default_max_tokens)
    spec = GenerationSpec(kind, model,
                          sampling_params(kind, body, max_model_len, vocab_size, ch, mt),
                          stream, include_usage, _stop(body), choices=ch, fit_max_tokens=fit,
                          cache=cache_scope(body))
    if kind == "chat":
        _chat(spec, body, multimodal, tool_format)
    else:
        _prompt(spec, body)
    return spec


__all__ = ["APIError", "FIELDS", "GenerationSpec", "parse"]
