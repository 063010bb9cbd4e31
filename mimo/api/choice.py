"""One choice of a response as it is generated: text deltas in (TextDelta from the pipeline),
OpenAI's choice object out, whole or as stream deltas. Tool calls and reasoning go through
one mimo.tools.OutputParser, so the streamed deltas assemble into the non-streamed choice.
Logprobs are shaped as OpenAI shapes them: chat `{"content": [...]}`, completions
`{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`."""
from __future__ import annotations

import uuid

from ..tools import OutputParser, ToolCall
from .schemas import GenerationSpec

_FLOOR = -9999.0        # JSON has no -inf: a vanishing probability's logprob is floored


def _lp(v: float) -> float:
    return v if v > _FLOOR else _FLOOR


class Choice:
    def __init__(self, index: int, spec: GenerationSpec, tokenizer, parser: OutputParser | None):
        self.index, self.spec, self.tok = index, spec, tokenizer
        self.parser = parser if parser is not None and parser.enabled else None
        self.text: list[str] = []
        self.logprobs: list = []
        self.finish: str | None = None
        self.calls: list[ToolCall] = []
        self.call_ids: list[str] = []
        self.offset = 0           # completions' text_offset of the next token
        tools = spec.tools
        self.legacy = tools is not None and tools.legacy
        self.single = tools is not None and not tools.parallel

    # ---- feeding ------------------------------------------------------------------------
    def feed(self, delta) -> list[tuple[str, object]]:
        """Take one TextDelta; returns its events: ("content" | "reasoning", text) and
        ("call", index of the new call)."""
        text, reason = delta
        self.finish = reason or self.finish
        if self.spec.choices.logprobs is not None or self.spec.choices.best_of > self.spec.n:
            self.logprobs.extend(delta.logprobs)
        self.text.append(text)
        if self.parser is None:
            return [("content", text)] if text else []
        events = self.parser.feed(text)
        if reason is not None:
            events += self.parser.finish()
        return [self._call(e) if e[0] == "call" else e for e in events]

    def _call(self, e):
        call = e[1]
        if self.single and self.calls:
            return ("dropped", None)     # parallel_tool_calls false: the first call only
        self.calls.append(call)
        self.call_ids.append("call_" + uuid.uuid4().hex[:24])
        return ("call", len(self.calls) - 1)

    @property
    def mean_logprob(self) -> float:
        lps = [x.logprob for x in self.logprobs]
        return sum(lps) / len(lps) if lps else 0.0

    @property
    def finish_reason(self) -> str | None:
        if self.calls and self.finish == "stop":
            return "function_call" if self.legacy else "tool_calls"
        return self.finish

    # ---- shaping ------------------------------------------------------------------------
    def tool_call(self, i: int) -> dict:
        c = self.calls[i]
        return {"id": self.call_ids[i], "type": "function",
                "function": {"name": c.name, "arguments": c.arguments}}

    def _entry(self, token: int, logprob: float) -> dict:
        s = self.tok.decode([token], skip_special_tokens=False)
        return {"token": s, "logprob": _lp(logprob), "bytes": list(s.encode("utf-8"))}

    def chat_logprobs(self, lps) -> dict | None:
        if self.spec.choices.logprobs is None:
            return None
        content = []
        for x in lps:
            e = self._entry(x.token, x.logprob)
            e["top_logprobs"] = [self._entry(t, v) for t, v in x.top]
            content.append(e)
        return {"content": content, "refusal": None}

    def completion_logprobs(self, lps) -> dict | None:
        if self.spec.choices.logprobs is None:
            return None
        out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for x in lps:
            s = self.tok.decode([x.token], skip_special_tokens=False)
            out["tokens"].append(s)
            out["token_logprobs"].append(_lp(x.logprob))
            out["top_logprobs"].append({self.tok.decode([t], skip_special_tokens=False): _lp(v)
                                        for t, v in x.top} if self.spec.choices.logprobs else None)
            out["text_offset"].append(self.offset)
            self.offset += len(s)
        return out

    def message(self) -> dict:
        """The non-streamed chat message."""
        if self.parser is None:
            content, reasoning = "".join(self.text), None
        else:
            content, reasoning = self.parser.out.content, self.parser.out.reasoning or None
        msg: dict = {"role": "assistant", "content": content}
        if self.calls:
            # The parser dropped the whitespace around the calls (streamed the same way).
            msg["content"] = content or None
            if self.legacy:
                msg["function_call"] = self.tool_call(0)["function"]
            else:
                msg["tool_calls"] = [self.tool_call(i) for i in range(len(self.calls))]
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        return msg

    def chat_choice(self) -> dict:
        return {"index": self.index, "message": self.message(),
                "finish_reason": self.finish_reason,
                "logprobs": self.chat_logprobs(self.logprobs)}

    def completion_choice(self, prompt_text: str = "") -> dict:
        self.offset = len(prompt_text)
        return {"index": self.index, "text": prompt_text + "".join(self.text),
                "finish_reason": self.finish, "logprobs": self.completion_logprobs(self.logprobs)}

    def chat_delta(self, events) -> dict:
        """A stream chunk's delta for `events` (from `feed`)."""
        d: dict = {}
        for kind, v in events:
            if kind == "content":
                d["content"] = d.get("content", "") + v
            elif kind == "reasoning":
                d["reasoning_content"] = d.get("reasoning_content", "") + v
            elif kind == "call":
                if self.legacy:
                    d["function_call"] = self.tool_call(v)["function"]
                else:
                    d.setdefault("tool_calls", []).append({"index": v, **self.tool_call(v)})
        return d
