"""The prompt tokens a worker would build for a request, computed by the router itself.

The router loads only the model's tokenizer and configuration (no weights) and runs the
workers' own code on the body: `api.schemas.parse`, `api.chat_pipeline.chat_request` and
`stages.prompt.BuildPrompt.tokenize` (chat template, tools folded in as the worker does), so
the page keys it hashes are the ones the workers' trees hold. A prompt with images, on a
vision-language model, is expanded and keyed in its media namespace as the worker does it
(and a `cache_salt` joins the namespace as the worker's `request_namespace` makes it)
(router/media.py: data: URLs; `image_max_pixels` must be the workers' --image-max-pixels). A
body the workers would refuse, or media the router cannot see (http(s) or file URLs, videos),
has no prompt here: it is routed by load alone, and the worker answers it.
"""
from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path

from ..kvcache.radix.namespace import request_namespace


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    namespace: Hashable = None      # the tree's key space (kvcache.radix.namespace: media, salt)


class PromptBuilder:
    def __init__(self, model: str, image_max_pixels: int | None = None):
        from ..models.hf_config import model_config_from_hf
        from ..models.registry import resolve
        from ..models.tokenizer import Tokenizer
        from ..stages.prompt import BuildPrompt
        from ..tools import format_for
        path = Path(resolve(model))
        if path.is_file():
            from ..models.gguf_loader import gguf_hf_config, open_gguf
            f = open_gguf(path)
            try:
                cfg = model_config_from_hf(gguf_hf_config(f))
                tok = Tokenizer.from_gguf(f.metadata)
            finally:
                f.close()
        else:
            cfg = model_config_from_hf(json.loads((path / "config.json").read_text()))
            tok = Tokenizer.from_hf_dir(path)
        self.arch, self.vocab = cfg.arch, cfg.vocab_size
        self.tool_format = format_for(cfg.arch)
        from ..multimodal.adapter import adapter_for
        adapter = adapter_for(cfg)
        self.media = None
        if adapter is not None:
            from ..multimodal.config import MediaConfig
            from .media import MediaKeys
            self.media = MediaKeys(adapter, MediaConfig(resize_max_pixels=image_max_pixels))
        self.stage = BuildPrompt(tok, cfg.arch, adapter)

    def prompt(self, kind: str, body) -> Prompt | None:
        """The body's prompt (its first choice) as the worker keys it, None when unknown.
        A Responses body is known when it starts a chain (no previous_response_id: the
        chain's items are in the worker's store, not here): its chat body is built as the
        worker builds it."""
        from ..api import schemas
        from ..api.chat_pipeline import chat_request
        if kind == "responses":
            kind, body = "chat", _responses_chat(body)
            if body is None:
                return None
        try:
            spec = schemas.parse(kind, body, 2**31, multimodal=self.media is not None,
                                 vocab_size=self.vocab, tool_format=self.tool_format)
            ids = self.stage.tokenize(chat_request(spec))
            salt = spec.cache.salt
            if not spec.media:
                return Prompt(ids, request_namespace(None, salt))
            if self.media is None:
                return None
            got = self.media.expand(ids, spec.media)
            return None if got is None else Prompt(got[0], request_namespace(got[1], salt))
        except Exception:  # noqa: BLE001 - the worker answers what it refuses
            return None

    def prompt_ids(self, kind: str, body) -> list[int] | None:
        """Token ids of the body's prompt, None when unknown."""
        p = self.prompt(kind, body)
        return None if p is None else p.ids


def _responses_chat(body) -> dict | None:
    """The chat body a worker makes of a Responses body that starts a chain (None: it
    continues one, or the worker would refuse it)."""
    from ..api.responses.items import to_messages
    from ..api.responses.request import parse_request
    try:
        req = parse_request(body)
    except Exception:  # noqa: BLE001 - the worker answers what it refuses
        return None
    if req.previous_response_id is not None:
        return None
    return {**req.chat, "messages": to_messages(req.instructions, req.items)}
