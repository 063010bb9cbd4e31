"""tokenize: chat messages (through the model's chat template) or a text prompt -> token ids."""
from __future__ import annotations

import asyncio

from ..models.chat_template import ChatTemplate
from ..pipeline import InvalidRequest, Stage


class Tokenize(Stage):
    """Reads req.data['spec'] (an api GenerationSpec); returns prompt token ids."""
    name = "tokenize"
    max_concurrency = 4

    def __init__(self, tokenizer, arch: str | None):
        super().__init__()
        self.tokenizer = tokenizer
        self.arch = arch
        self._template: ChatTemplate | None = None

    def template(self) -> ChatTemplate:
        if self._template is None:
            self._template = ChatTemplate.for_model(self.tokenizer, self.arch)
        return self._template

    async def process(self, req):
        spec = req.data["spec"]
        if spec.prompt_ids is not None:
            return spec.prompt_ids
        if spec.messages is not None:
            tpl = self.template()
            # Long prompts take milliseconds to encode: keep them off the event loop.
            return await asyncio.to_thread(tpl.encode, self.tokenizer, spec.messages)
        if not spec.prompt:
            raise InvalidRequest("prompt is empty")
        return await asyncio.to_thread(self.tokenizer.encode, spec.prompt)
