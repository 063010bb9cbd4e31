"""/tokenize and /detokenize, in vLLM's shapes. Every field is honoured, or refused with a
400 naming it; a field these routes do not know is refused too (no SDK adds its own here).

/tokenize, a text: {"model"?, "prompt": str, "add_special_tokens"?: true,
                    "return_token_strs"?: false}
/tokenize, a chat: {"model"?, "messages": [...], "add_generation_prompt"?: true,
                    "add_special_tokens"?: false, "return_token_strs"?: false,
                    "tools"?, "tool_choice"?, "functions"?, "function_call"?,
                    "continue_final_message"?: false, "chat_template"?: null,
                    "chat_template_kwargs"?: null, "mm_processor_kwargs"?: null}
  -> {"tokens", "count", "max_model_len", "token_strs"} (token_strs: null unless asked;
     each token as the vocabulary spells it)
/detokenize: {"model"?, "tokens": [ids]} -> {"prompt"} (special tokens kept)

`add_special_tokens`: the tokenizer's own special tokens (Gemma's BOS) around the ids. A
chat template writes its own BOS, so for messages it defaults to false, and true adds a
second one, as vLLM does. The chat is rendered as generation renders it (tool list, forced
tool choices, media expanded to their rows); the last four chat fields can only be left at
their defaults, since chat completions take none of them and /tokenize counts what
generation sees.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from . import schemas
from .chat_pipeline import chat_request
from .errors import bad_request
from .fields import boolean, kind_of

TOOL_FIELDS = ("tools", "tool_choice", "functions", "function_call")
_TEXT = frozenset({"model", "prompt", "add_special_tokens", "return_token_strs"})
_CHAT_ONLY = frozenset({"messages", "add_generation_prompt", "continue_final_message",
                        "chat_template", "chat_template_kwargs", "mm_processor_kwargs",
                        *TOOL_FIELDS})
_CHAT = (_TEXT - {"prompt"}) | _CHAT_ONLY
_DETOKENIZE = frozenset({"model", "tokens"})
# Chat fields that can only be left at these values here.
_DEFAULT_ONLY: dict[str, tuple[object, ...]] = {
    "continue_final_message": (None, False), "chat_template": (None,),
    "chat_template_kwargs": (None, {}), "mm_processor_kwargs": (None, {})}


@dataclass(frozen=True)
class TokenizeQuery:
    chat: bool                      # messages (else a text prompt)
    add_generation_prompt: bool
    add_special_tokens: bool
    token_strs: bool


def _unknown(body: dict, known: frozenset, route: str) -> None:
    for k in sorted(body):
        if k not in known:
            raise bad_request(f"'{k[:64]}' is not a field of {route} (it takes "
                              f"{', '.join(sorted(known))})", k[:64], "unknown_parameter")


def parse_query(body: dict) -> TokenizeQuery:
    chat = "messages" in body
    if chat and "prompt" in body:
        raise bad_request("send 'prompt' or 'messages' to /tokenize, not both", "prompt")
    if not chat:
        if "prompt" not in body:
            raise bad_request("/tokenize takes 'prompt' (a string) or 'messages'", "prompt")
        misplaced = sorted(k for k in body if k in _CHAT_ONLY)
        if misplaced:
            raise bad_request(f"'{misplaced[0]}' goes with 'messages', not 'prompt'",
                              misplaced[0], "unsupported_parameter")
    _unknown(body, _CHAT if chat else _TEXT, "/tokenize")
    for name, ok in _DEFAULT_ONLY.items():
        v = body.get(name)
        if not any(v == o and type(v) is type(o) for o in ok):
            raise bad_request(f"'{name}' is not supported by this server (got "
                              f"{str(v)[:40]!r}); it renders the model's own chat template "
                              f"as chat completions do", name, "unsupported_parameter")
    return TokenizeQuery(chat, boolean(body, "add_generation_prompt", True),
                         boolean(body, "add_special_tokens", not chat),
                         boolean(body, "return_token_strs", False))


async def tokenize(server, body: dict) -> dict:
    """`server`: the app's Server (its chat pipeline, tokenizer, tool format, limits)."""
    q = parse_query(body)
    tok = server.tokenizer
    if q.chat:
        tools = {k: body[k] for k in TOOL_FIELDS if k in body}
        spec = schemas.parse("chat", {"model": server.model_name, "max_tokens": 1,
                                      "messages": body["messages"], **tools},
                             server.max_model_len, multimodal=server.chat_pipeline.multimodal,
                             tool_format=server.tool_format)
        req = chat_request(spec)
        pipeline = server.chat_pipeline
        if req.media:       # counted as generation counts them: placeholders expanded
            ids = await pipeline.prompt_ids_with_media(req, q.add_generation_prompt)
        else:
            ids = await asyncio.to_thread(pipeline.prompt.tokenize, req,
                                          q.add_generation_prompt)
        if q.add_special_tokens:    # what encode(text, add_special_tokens=True) adds
            ids = [tok.bos_token_id] * tok.add_bos + ids + [tok.eos_token_id] * tok.add_eos
    else:
        p = body["prompt"]
        if not isinstance(p, str):
            raise bad_request(f"'prompt' must be a string, got {kind_of(p)}", "prompt")
        ids = await asyncio.to_thread(tok.encode, p, q.add_special_tokens)
    strs = [tok.id_to_token(i) for i in ids] if q.token_strs else None
    return {"tokens": ids, "count": len(ids), "max_model_len": server.max_model_len,
            "token_strs": strs}


def detokenize(server, body: dict) -> dict:
    _unknown(body, _DETOKENIZE, "/detokenize")
    ids = body.get("tokens")
    vocab = server.info.vocab_size
    if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids):
        raise bad_request(f"'tokens' must be a list of token ids in [0, {vocab})", "tokens")
    return {"prompt": server.tokenizer.decode(ids, skip_special_tokens=False)}
