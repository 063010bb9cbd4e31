"""The prompt tokens a worker would build for a request, computed by the router itself.

The router loads only the model's tokenizer and configuration (no weights) and runs the
workers' own code on the body: `api.schemas.parse`, `api.chat_pipeline.chat_request` and
`stages.prompt.BuildPrompt.tokenize` (chat template, tools folded in as the worker does), so
the page keys it hashes are the ones the workers' trees hold. A body the workers would refuse,
or one with media (its KV lives under a namespace of media hashes), has no prompt here: it is
routed by load alone, and the worker answers it.
"""
from __future__ import annotations

import json
from pathlib import Path


class PromptBuilder:
    def __init__(self, model: str):
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
        self.stage = BuildPrompt(tok, cfg.arch)

    def prompt_ids(self, kind: str, body) -> list[int] | None:
        """Token ids of the body's prompt (its first choice), None when there is none."""
        from ..api import schemas
        from ..api.chat_pipeline import chat_request
        try:
            spec = schemas.parse(kind, body, 2**31, multimodal=False, vocab_size=self.vocab,
                                 tool_format=self.tool_format)
            if spec.media:
                return None
            return self.stage.tokenize(chat_request(spec))
        except Exception:  # noqa: BLE001 - the worker answers what it refuses
            return None
