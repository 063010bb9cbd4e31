"""Model output -> reasoning, content and tool calls, incrementally: `feed` takes text as it
is generated and returns what is settled; `finish` flushes. The non-streamed answer is the
same parser run over the whole text, so streamed deltas assemble into exactly it.

Text that could still begin a marker (a tool call's start, the reasoning block's end) is
held back until it is decided. A call is looked for everywhere, also inside the reasoning
block (MiMo-V2-Flash writes calls there despite its template's instructions; a call found
there is a call, not reasoning). A block that does not parse as calls stays text; an
unterminated block at the end (a model that stops without the closing tag) is a call if it
parses, else text. A parsed call the client cannot take stays text too: one naming a function
it did not declare, or one of a strict function whose arguments do not validate against the
function's schema (`strict`: name -> the schema to validate with).

With tools on, content that is whitespace only so far is held back until text that is not
whitespace follows, or the output ends: there it is dropped if calls were found, else
emitted. So the trailing whitespace around a call ("Sure.\n\n<tool_call>...") is in neither
the streamed deltas nor the whole answer, and the two assemble exactly.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .formats import Marker, ToolCall, ToolFormat


@dataclass
class ParsedOutput:
    content: str = ""
    reasoning: str = ""
    calls: list[ToolCall] = field(default_factory=list)


Event = tuple[str, object]      # ("content" | "reasoning", str) or ("call", ToolCall)


class OutputParser:
    def __init__(self, fmt: ToolFormat, tools: bool, reasoning: bool = True,
                 schemas: dict | None = None, strict: dict | None = None):
        """`schemas`: the declared functions' argument schemas by name (with tools on, a call
        to any other name is text); `strict`: name -> schema its arguments must satisfy."""
        self.markers: tuple[Marker, ...] = fmt.markers if tools else ()
        self.think = fmt.reasoning if reasoning else None
        self.declared = schemas is not None     # None: any name is taken (no declarations)
        self.schemas = schemas or {}
        self.strict = strict or {}
        self._validators: dict[str, Any] = {}
        self.ws = ""            # held-back whitespace-only content (tools on)
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
        events = self._drain(True)
        if self.ws and not self.out.calls:
            self._put(events, "content", self.ws)
        self.ws = ""
        return events

    def _emit(self, events: list[Event], kind: str, value) -> None:
        if kind == "content" and self.markers and value:
            value = self.ws + value
            body = value.rstrip()
            self.ws = value[len(body):]
            value = body
        self._put(events, kind, value)

    def _put(self, events: list[Event], kind: str, value) -> None:
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
        if calls and all(self._takes(c) for c in calls):
            for c in calls:
                self._emit(events, "call", c)
        else:
            self._emit(events, self._text_kind(), m.start + block + (m.end if closed else ""))

    def _takes(self, call: ToolCall) -> bool:
        """The client declared this function, and a strict one's arguments validate."""
        if self.declared and call.name not in self.schemas:
            return False
        schema = self.strict.get(call.name)
        if schema is None:
            return True
        v = self._validators.get(call.name)
        if v is None:
            # imported here: only strict tools need it (~58 ms of each start)
            import jsonschema

            try:
                cls = jsonschema.validators.validator_for(schema)
                cls.check_schema(schema)
            except jsonschema.SchemaError:
                return False        # nothing validates against a broken schema
            v = self._validators[call.name] = cls(schema)
        try:
            return bool(v.is_valid(json.loads(call.arguments)))
        except Exception:  # noqa: BLE001 - a $ref that resolves nowhere: no valid arguments
            return False

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
