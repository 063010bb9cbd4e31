"""OpenAI request bodies -> validated `GenerationSpec`. Every rejection names the field."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..engine.sampling_params import SamplingParams
from ..multimodal.item import MediaItem
from .content import parse_content, valid_unicode
from .errors import APIError, bad_request

# Accepted and ignored: they change nothing a single-choice, text-only completion returns.
_IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "stream_options",
            "frequency_penalty", "presence_penalty", "logit_bias", "response_format", "echo",
            "suffix", "best_of", "logprobs", "top_logprobs", "tools", "tool_choice",
            "modalities", "prediction", "reasoning_effort", "web_search_options", "audio",
            "functions", "function_call"}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
           "n", "ignore_eos", "stop_token_ids"}
MAX_STOP = 4
# Below this a temperature means greedy: logits / T overflows float32 for tiny T, and
# sampling from inf/nan probabilities fails inside the engine step.
MIN_TEMPERATURE = 1e-5
SEED_RANGE = (-(2**63), 2**64 - 1)     # what torch.Generator.manual_seed accepts


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


def _num(body, name, lo=None, hi=None, integer=False, default=None):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise bad_request(f"'{name}' must be {'an integer' if integer else 'a number'}, "
                          f"got {type(v).__name__}", name)
    if isinstance(v, float) and not math.isfinite(v):
        raise bad_request(f"'{name}' must be finite", name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        want = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]"
        raise bad_request(f"'{name}' must be {want}, got {v}", name)
    return v


def _params(body: dict, max_model_len: int) -> SamplingParams:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    param = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    if max_tokens is None:
        max_tokens = 256
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise bad_request(f"'{param}' must be an integer", param)
    if max_tokens < 1:
        raise bad_request(f"'{param}' must be >= 1, got {max_tokens}", param)
    if max_tokens >= max_model_len:
        raise bad_request(f"'{param}' is {max_tokens}; the context is {max_model_len} tokens",
                          param, "context_length_exceeded")
    top_k = _num(body, "top_k", -1, None, integer=True, default=0)
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or any(isinstance(t, bool) or not isinstance(t, int)
                                              or t < 0 for t in stop_ids):
        raise bad_request("'stop_token_ids' must be a list of non-negative integers", "stop_token_ids")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise bad_request("'ignore_eos' must be a boolean", "ignore_eos")
    temperature = float(_num(body, "temperature", 0.0, 2.0, default=1.0))
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature if temperature >= MIN_TEMPERATURE else 0.0,
        top_p=float(_num(body, "top_p", 0.0, 1.0, default=1.0)) or 1e-9,
        top_k=top_k, seed=_num(body, "seed", *SEED_RANGE, integer=True),
        stop_token_ids=stop_ids, ignore_eos=ignore_eos)


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


def parse(kind: str, body: Any, max_model_len: int, multimodal: bool = False) -> GenerationSpec:
    """`multimodal`: the model takes image_url / video_url parts (else they are a 400)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    allowed = _COMMON | _IGNORED | ({"messages", "max_completion_tokens"} if kind == "chat"
                                     else {"prompt"})
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad_request(f"unknown field(s): {', '.join(unknown)}", unknown[0])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a string", "model")
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise bad_request("only n=1 is supported", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", "stream")
    so = body.get("stream_options")
    if so is not None and (not isinstance(so, dict) or not isinstance(so.get("include_usage", False), bool)):
        raise bad_request("'stream_options' must be an object like {\"include_usage\": true}",
                          "stream_options")
    spec = GenerationSpec(kind, model, _params(body, max_model_len), stream,
                          bool(so and so.get("include_usage")), _stop(body))
    if kind == "chat":
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise bad_request("'messages' must be a non-empty list", "messages")
        out = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict):
                raise bad_request(f"messages[{i}] must be an object", "messages")
            if m.get("role") not in ("system", "user", "assistant", "developer"):
                raise bad_request(f"messages[{i}].role {m.get('role')!r} is not one of system, "
                                  f"user, assistant", "messages")
            role = "system" if m["role"] == "developer" else m["role"]
            out.append({"role": role, "content": parse_content(
                m.get("content"), i, role, multimodal, spec.media)})
        spec.messages = out
    else:
        p = body.get("prompt")
        if isinstance(p, str):
            if not p:
                raise bad_request("'prompt' is empty", "prompt")
            spec.prompt = valid_unicode(p, "'prompt'", "prompt")
        elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            spec.prompt_ids = list(p)
        elif isinstance(p, list) and len(p) == 1 and isinstance(p[0], str) and p[0]:
            spec.prompt = valid_unicode(p[0], "'prompt'", "prompt")
        else:
            raise bad_request("'prompt' must be a non-empty string, one string in a list, or a "
                              "list of token ids", "prompt")
    return spec


__all__ = ["APIError", "GenerationSpec", "parse"]
