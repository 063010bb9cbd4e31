"""The sampling fields of an OpenAI body -> `SamplingParams`, each checked as OpenAI
documents it (type, range, the fields it needs) or as vLLM-style servers define the
extensions (top_k, min_p, repetition_penalty, min_tokens, ignore_eos, stop_token_ids)."""
from __future__ import annotations

from dataclasses import dataclass

from ..engine.sampling_params import MAX_LOGPROBS, SamplingParams
from .errors import bad_request
from .fields import boolean, check_keys, kind_of, number

MAX_N = 16                 # most choices per request (n, best_of)
MAX_COMPLETION_LOGPROBS = 5    # completions' `logprobs` (OpenAI's limit)
# Below this a temperature means greedy: logits / T overflows float32 for tiny T, and
# sampling from inf/nan probabilities fails inside the engine step.
MIN_TEMPERATURE = 1e-5
SEED_RANGE = (-(2**63), 2**64 - 1)     # what torch.Generator.manual_seed accepts


@dataclass(frozen=True)
class Choices:
    n: int                  # choices returned
    best_of: int            # samples generated (>= n; the best n by mean logprob are kept)
    logprobs: int | None    # top alternatives the client asked for (None: no logprobs shown)


def _one_max(body: dict, name: str, max_model_len: int) -> int | None:
    v = number(body, name, None, integer=True)
    if v is None:
        return None
    if v < 1:
        raise bad_request(f"'{name}' must be >= 1, got {v}", name)
    if v >= max_model_len:
        shown = v if v < 10**30 else f"a {len(str(v))}-digit number"
        raise bad_request(f"'{name}' is {shown}; the context is {max_model_len} tokens",
                          name, "context_length_exceeded")
    return v


def max_tokens(body: dict, kind: str, max_model_len: int, default: int | None
               ) -> tuple[int, bool]:
    """(max_tokens, fit): `fit` means the client set no bound, and the value is a cap that
    generation cuts to the rest of the context once the prompt's length is known (as OpenAI
    does); `default` (--default-max-tokens) bounds it further. Chat's max_completion_tokens
    and max_tokens are both checked; sent together they must agree."""
    v = _one_max(body, "max_tokens", max_model_len)
    if kind == "chat":
        mc = _one_max(body, "max_completion_tokens", max_model_len)
        if mc is not None and v is not None and mc != v:
            raise bad_request(f"'max_tokens' ({v}) and 'max_completion_tokens' ({mc}) "
                              f"disagree; send one of them", "max_tokens")
        v = mc if mc is not None else v
    if v is not None:
        return v, False
    cap = max_model_len - 1
    return (cap if default is None else max(1, min(default, cap))), True


def _logit_bias(body: dict, vocab_size: int) -> dict[int, float]:
    lb = body.get("logit_bias")
    if lb is None:
        return {}
    if not isinstance(lb, dict):
        raise bad_request(f"'logit_bias' must be an object mapping token ids to numbers, got "
                          f"{kind_of(lb)}", "logit_bias")
    check_keys(lb, "logit_bias")
    out = {}
    for k, v in lb.items():
        if not (k.isascii() and k.isdigit()) or int(k) >= vocab_size:
            raise bad_request(f"'logit_bias' key {k[:40]!r} is not a token id in "
                              f"[0, {vocab_size})", "logit_bias")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise bad_request(f"'logit_bias[{k}]' must be a number in [-100, 100], got "
                              f"{v if isinstance(v, (int, float)) else kind_of(v)}", "logit_bias")
        out[int(k)] = float(v)
    return out


def _stop_ids(body: dict) -> list[int]:
    ids = body.get("stop_token_ids")
    if ids is None:
        return []
    if not isinstance(ids, list) or any(isinstance(t, bool) or not isinstance(t, int) or t < 0
                                        for t in ids):
        raise bad_request("'stop_token_ids' must be a list of non-negative integers",
                          "stop_token_ids")
    return ids


def choices(kind: str, body: dict, stream: bool) -> Choices:
    n = number(body, "n", 1, 1, MAX_N, integer=True)
    best_of = n
    if kind == "completion":
        best_of = number(body, "best_of", n, 1, MAX_N, integer=True)
        if best_of < n:
            raise bad_request(f"'best_of' ({best_of}) must be >= n ({n})", "best_of")
        if best_of > n and stream:
            raise bad_request("'best_of' > n cannot be streamed", "best_of")
        lp = number(body, "logprobs", None, 0, MAX_COMPLETION_LOGPROBS, integer=True)
    else:
        want = boolean(body, "logprobs", False)
        top = number(body, "top_logprobs", None, 0, MAX_LOGPROBS, integer=True)
        if top is not None and not want:
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        lp = (top or 0) if want else None
    return Choices(n, best_of, lp)


def sampling_params(kind: str, body: dict, max_model_len: int, vocab_size: int,
                    ch: Choices, max_tok: int) -> SamplingParams:
    """`max_tok`: from `max_tokens` (a bound the client set, or the cap when it set none)."""
    min_tokens = number(body, "min_tokens", 0, 0, integer=True)
    if min_tokens > max_tok:
        raise bad_request(f"'min_tokens' ({min_tokens}) must be <= max_tokens ({max_tok})",
                          "min_tokens")
    temperature = float(number(body, "temperature", 1.0, 0.0, 2.0))
    lp = ch.logprobs
    if ch.best_of > ch.n and lp is None:
        lp = 0                  # ranking the samples needs their logprobs (not shown)
    return SamplingParams(
        max_tokens=max_tok,
        temperature=temperature if temperature >= MIN_TEMPERATURE else 0.0,
        top_p=float(number(body, "top_p", 1.0, 0.0, 1.0)) or 1e-9,
        top_k=number(body, "top_k", 0, -1, integer=True),
        seed=number(body, "seed", None, *SEED_RANGE, integer=True),
        stop_token_ids=_stop_ids(body), ignore_eos=boolean(body, "ignore_eos", False),
        min_p=float(number(body, "min_p", 0.0, 0.0, 1.0)), min_tokens=min_tokens,
        frequency_penalty=float(number(body, "frequency_penalty", 0.0, -2.0, 2.0)),
        presence_penalty=float(number(body, "presence_penalty", 0.0, -2.0, 2.0)),
        repetition_penalty=_repetition(body), logit_bias=_logit_bias(body, vocab_size),
        logprobs=lp)


def _repetition(body: dict) -> float:
    v = float(number(body, "repetition_penalty", 1.0, 0.0, 2.0**31))
    if v <= 0:
        raise bad_request("'repetition_penalty' must be > 0", "repetition_penalty")
    return v


__all__ = ["MAX_N", "Choices", "choices", "max_tokens", "sampling_params"]
