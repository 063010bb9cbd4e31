"""prompt: the request's prompt, built once, after the encoder ran: chat messages (through
the model's chat template) or a text prompt -> token ids, then each media item's pad token
expanded to its embedding rows and the engine's MMPrompt built (multimodal.placeholders).
Writes req.prompt_ids and req.mm_prompt.

Media parts ({"type": "image"|"video"}) become the model's placeholder text (what the vision
adapter says its template writes for such a part) before the template runs: the template
layer takes string contents only. Each placeholder is one pad token after tokenizing, and
becomes as many as the item's grid yields when the media are placed.
"""
from __future__ import annotations

import asyncio

from ..models.chat_template import ChatTemplate
from ..multimodal.adapter import VisionAdapter
from ..multimodal.mm_prompt import MMPrompt
from ..multimodal.placeholders import place_media
from ..pipeline import InvalidRequest, Stage
from ..tools.formats import FORMATS, format_for
from ..tools.prompt import fold_tools
from .chat_request import ChatRequest


class BuildPrompt(Stage):
    """`adapter`: the model's vision adapter (None for a text-only model)."""
    name = "prompt"
    max_concurrency = 4

    def __init__(self, tokenizer, arch: str | None, adapter: VisionAdapter | None = None):
        super().__init__()
        self.tokenizer = tokenizer
        self.arch = arch
        self.adapter = adapter
        self.placeholders = ({k: adapter.placeholder_text(tokenizer, k) for k in adapter.kinds}
                             if adapter is not None else {})
        self._template: ChatTemplate | None = None

    def template(self) -> ChatTemplate:
        if self._template is None:
            self._template = ChatTemplate.for_model(self.tokenizer, self.arch)
        return self._template

    async def process(self, req: ChatRequest) -> None:
        if req.messages is not None:
            self.template()     # made once, on the loop: the first request builds it
        # Long prompts take milliseconds to encode: keep them off the event loop.
        req.prompt_ids, req.mm_prompt = await asyncio.to_thread(self.build, req)

    def build(self, req: ChatRequest) -> tuple[list[int], MMPrompt | None]:
        ids = self.tokenize(req)
        if self.adapter is None:
            return ids, None
        return place_media(ids, self.adapter, req.preprocessed, req.embeds)

    def tokenize(self, req: ChatRequest, add_generation_prompt: bool = True) -> list[int]:
        """`add_generation_prompt`: end a chat with the assistant turn's opening (/tokenize
        may ask for the conversation without it)."""
        gen = add_generation_prompt
        if req.token_ids is not None:
            return list(req.token_ids)
        if req.messages is not None:
            msgs = [self._flatten(m) for m in req.messages]
            tpl = self.template()
            tool_turns = any(m["role"] in ("tool", "function") or m.get("tool_calls")
                             for m in msgs)
            if (req.tools or tool_turns) and not tpl.supports_tools:
                fmt = FORMATS[req.tool_format] if req.tool_format else format_for(self.arch)
                msgs = fold_tools(msgs, req.tools, fmt)
                return tpl.encode(self.tokenizer, msgs, gen)
            msgs = [{**m, "role": "tool"} if m["role"] == "function" else m for m in msgs]
            return tpl.encode(self.tokenizer, msgs, gen, tools=req.tools)
        if not req.text:
            raise InvalidRequest("prompt is empty")
        return self.tokenizer.encode(req.text)

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
