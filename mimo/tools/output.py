"""Model output -> reasoning, content and tool calls, incrementally: `feed` takes text as it
is generated and returns what is settled; `finish` flushes. The non-streamed answer is the
same parser run over the whole text, so streamed deltas assemble into exactly it.

Text that could still begin a marker (a tool call's start, the reasoning block's end) is
held back until it is decided. A call is looked for everywhere, also inside the reasoning
block (MiMo-V2-Flash writes calls there despite its template's instructions; a call found
there is a call, not reasoning). A block that does not parse as calls stays text; an
unterminated block at the end (a model that stops without the closing tag) is a call if it
parses, else text.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .formats import Marker, ToolCall, ToolFormat


@dataclass
class ParsedOutput:
    content: str = ""
    reasoning: str = ""
    calls: list[ToolCall] = field(default_factory=list)


Event = tuple[str, object]      # ("content" | "reasoning", str) or ("call", ToolCall)


class OutputParser:
    def __init__(self, fmt: ToolFormat, tools: bool, reasoning: bool = True,
                 schemas: dict | None = None):
        self.markers: tuple[Marker, ...] = fmt.markers if tools else ()
        self.think = fmt.reasoning if reasoning else None
        self.schemas = schemas or {}
        self.mode = "start" if self.think else "content"
        self.buf = ""
        self.call: Marker | None = None
        self.out = ParsedOutput()

    @property
    def enabled(self) -> bool:
        return bool(self.markers or self.think)

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        return self._drain(False)

    def finish(self) -> list[Event]:
        return self._drain(True)

    def _emit(self, events: list[Event], kind: str, value) -> None:
        if kind == "call":
            self.out.calls.append(value)
        elif not value:
            return
        elif kind == "reasoning":
            self.out.reasoning += value
        else:
            self.out.content += value
        if kind != "call" and events and events[-1][0] == kind:
            events[-1] = (kind, events[-1][1] + value)
        else:
            events.append((kind, value))

    def _block(self, events: list[Event], m: Marker, block: str, closed: bool) -> None:
        calls = m.parse(block, self.schemas)
        if calls:
            for c in calls:
                self._emit(events, "call", c)
        else:
            self._emit(events, self._text_kind(), m.start + block + (m.end if closed else ""))

    def _text_kind(self) -> str:
        return "reasoning" if self.mode == "reasoning" else "content"

    def _drain(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            if self.call is not None:
                i = self.buf.find(self.call.end)
                if i < 0:
                    if final:
                        self._block(events, self.call, self.buf, False)
                        self.buf, self.call = "", None
                    return events
                self._block(events, self.call, self.buf[:i], True)
                self.buf, self.call = self.buf[i + len(self.call.end):], None
                continue
            if self.mode == "start":
                assert self.think is not None
                head = self.buf.lstrip()
                if head.startswith(self.think[0]):
                    self.buf, self.mode = head[len(self.think[0]):], "reasoning"
                    continue
                if not final and self.think[0].startswith(head):
                    return events        # could still be the opening tag
                self.mode = "content"
            found = [(self.buf.find(m.start), m.start, m) for m in self.markers]
            if self.mode == "reasoning" and self.think:
                found.append((self.buf.find(self.think[1]), self.think[1], None))
            found = [f for f in found if f[0] >= 0]
            if found:
                i, tag, m = min(found, key=lambda f: f[0])
                self._emit(events, self._text_kind(), self.buf[:i])
                self.buf = self.buf[i + len(tag):]
                if m is None:
                    self.mode = "content"
                else:
                    self.call = m
                continue
            safe = len(self.buf) if final else self._safe_len()
            self._emit(events, self._text_kind(), self.buf[:safe])
            self.buf = self.buf[safe:]
            return events

    def _safe_len(self) -> int:
        """How much of the buffer cannot be the start of a marker."""
        tags = [m.start for m in self.markers]
        if self.mode == "reasoning" and self.think:
            tags.append(self.think[1])
        keep = 0
        for t in tags:
            for k in range(min(len(t) - 1, len(self.buf)), 0, -1):
                if self.buf.endswith(t[:k]):
                    keep = max(keep, k)
                    break
        return len(self.buf) - keep
