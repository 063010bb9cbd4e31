"""A choice's parsed output (reasoning, text and calls, from chat's Choice / OutputParser) ->
Responses output items, and the stream events OpenAI sends while they are built.

One builder serves both answers: the non-streamed Response is the same builder run over the
whole output with its events dropped, so the streamed events assemble into exactly it. An
item opens when its kind of output starts (reasoning -> a `reasoning` item, text -> a
`message` with one output_text part, each call -> a `function_call`) and closes when another
kind starts or the output ends; cut by max_output_tokens, the open item is `incomplete`.
"""
from __future__ import annotations

from .items import new_id


class OutputBuilder:
    def __init__(self, choice):
        self.choice = choice              # mimo.api.choice.Choice (call ids, calls)
        self.items: list[dict] = []
        self.open: dict | None = None     # the item being written
        self.parts: list[str] = []        # its text so far
        # Logprobs (with no output parser only: text and tokens line up): those of deltas
        # that brought no text wait for the next text delta, or the end.
        self.lps: list[dict] = []         # the open message's
        self.pending: list[dict] = []

    # ---- events -------------------------------------------------------------------------
    def feed(self, events, logprobs: list[dict] | None = None) -> list[dict]:
        """Choice.feed's events (and the delta's logprobs entries) -> stream events (without
        sequence numbers)."""
        out: list[dict] = []
        self.pending += logprobs or []
        for kind, v in events:
            if kind in ("content", "reasoning") and v:
                if self.open is None or self.open["type"] != _ITEM[kind]:
                    out += self._close("completed")
                    out += self._start(kind)
                self.parts.append(v)
                out.append(self._delta(v))
            elif kind == "call":
                out += self._close("completed")
                out += self._call(v)
        return out

    def finish(self, status: str) -> list[dict]:
        """Close the open item (`status`: 'completed' or 'incomplete'); an output with no
        message and no call gets an empty message, as OpenAI's does."""
        out: list[dict] = []
        if self.pending and (self.open is None or self.open["type"] != "message"):
            out += self._close("completed")
            out += self._start("content")
        if self.pending:        # the last tokens brought no text (EOS, held bytes)
            out.append(self._delta(""))
        out += self._close(status)
        if not any(it["type"] in ("message", "function_call") for it in self.items):
            out += self._start("content")
            out += self._close(status)
        return out

    # ---- items --------------------------------------------------------------------------
    def _where(self) -> dict:
        assert self.open is not None, "events are placed only while an item is open"
        return {"item_id": self.open["id"], "output_index": len(self.items) - 1}

    def _start(self, kind: str) -> list[dict]:
        if kind == "reasoning":
            item: dict = {"id": new_id("rs"), "type": "reasoning", "summary": [],
                          "content": [], "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = {"id": new_id("msg"), "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}
            part = _text_part("")
        self.items.append(item)
        self.open, self.parts, self.lps = item, [], []
        return [{"type": "response.output_item.added", "output_index": len(self.items) - 1,
                 "item": _copy(item)},
                {"type": "response.content_part.added", **self._where(), "content_index": 0,
                 "part": part}]

    def _delta(self, text: str) -> dict:
        assert self.open is not None
        if self.open["type"] == "reasoning":
            return {"type": "response.reasoning_text.delta", **self._where(),
                    "content_index": 0, "delta": text}
        lps, self.pending = self.pending, []
        self.lps += lps
        return {"type": "response.output_text.delta", **self._where(), "content_index": 0,
                "delta": text, "logprobs": lps}

    def _close(self, status: str) -> list[dict]:
        item = self.open
        if item is None:
            return []
        text = "".join(self.parts)
        if item["type"] == "reasoning":
            part: dict = {"type": "reasoning_text", "text": text}
            done = {"type": "response.reasoning_text.done", **self._where(),
                    "content_index": 0, "text": text}
        else:
            part = _text_part(text, self.lps)
            done = {"type": "response.output_text.done", **self._where(), "content_index": 0,
                    "text": text, "logprobs": list(self.lps)}
        item["content"] = [part]
        item["status"] = status
        out = [done, {"type": "response.content_part.done", **self._where(),
                      "content_index": 0, "part": dict(part)},
               {"type": "response.output_item.done", "output_index": len(self.items) - 1,
                "item": _copy(item)}]
        self.open, self.parts, self.lps = None, [], []
        return out

    def _call(self, i: int) -> list[dict]:
        call = self.choice.calls[i]
        item = {"id": new_id("fc"), "type": "function_call",
                "call_id": self.choice.call_ids[i], "name": call.name, "arguments": "",
                "status": "in_progress"}
        self.items.append(item)
        where = {"item_id": item["id"], "output_index": len(self.items) - 1}
        added = {"type": "response.output_item.added", "output_index": where["output_index"],
                 "item": _copy(item)}
        item.update(arguments=call.arguments, status="completed")
        return [added,
                {"type": "response.function_call_arguments.delta", **where,
                 "delta": call.arguments},
                {"type": "response.function_call_arguments.done", **where,
                 "arguments": call.arguments},
                {"type": "response.output_item.done", "output_index": where["output_index"],
                 "item": _copy(item)}]


_ITEM = {"content": "message", "reasoning": "reasoning"}


def _text_part(text: str, logprobs: list[dict] | None = None) -> dict:
    return {"type": "output_text", "text": text, "annotations": [],
            "logprobs": list(logprobs or [])}


def _copy(item: dict) -> dict:
    return {**item, "content": [dict(p) for p in item["content"]]} if "content" in item \
        else dict(item)


def usage(u, reasoning_tokens: int = 0) -> dict:
    """mimo's Usage -> the Responses usage object. cache_write_tokens: the prompt tokens this
    request computed, whose KV the prefix cache then holds for the next turn."""
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens,
                                     "cache_write_tokens": u.prompt_tokens - u.cached_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": u.prompt_tokens + u.completion_tokens}
