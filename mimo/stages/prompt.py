"""tokenize: chat messages (through the model's chat template) or a text prompt -> token ids.

Media parts ({"type": "image"|"video"}) become the model's placeholder text (what the vision
adapter says its template writes for such a part) before the template runs: the template
layer takes string contents only. Each placeholder is one pad token here; the mm_prompt
stage expands it once the item's grid is known."""
from __future__ import annotations

import asyncio

from ..models.chat_template import ChatTemplate
from ..pipeline import InvalidRequest, Stage


class Tokenize(Stage):
    """Reads req.data['spec'] (an api GenerationSpec); returns prompt token ids."""
    name = "tokenize"
    max_concurrency = 4

    def __init__(self, tokenizer, arch: str | None, placeholders: dict[str, str] | None = None):
        super().__init__()
        self.tokenizer = tokenizer
        self.arch = arch
        self.placeholders = placeholders or {}     # "image"/"video" -> placeholder text
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
            msgs = [self._flatten(m) for m in spec.messages]
            return await asyncio.to_thread(tpl.encode, self.tokenizer, msgs)
        if not spec.prompt:
            raise InvalidRequest("prompt is empty")
        return await asyncio.to_thread(self.tokenizer.encode, spec.prompt)

    def _flatten(self, msg: dict) -> dict:
        content = msg["content"]
        if isinstance(content, str):
            return msg
        out = []
        for part in content:
            if part["type"] == "text":
                out.append(part["text"])
            elif part["type"] in self.placeholders:
                out.append(self.placeholders[part["type"]])
            else:
                raise InvalidRequest(f"this model takes no {part['type']} parts")
        return {**msg, "content": "".join(out)}
