"""Resuming a stream whose worker failed after its first byte, on another worker.

Only a deterministic request is resumed: a completion or chat completion with temperature 0
or a `seed`, n == 1 (best_of too) and no logprobs (they could differ in the last digits
between workers; the content must not). While such a stream runs, the router forwards it
event by event (whole SSE events only, so the client never holds half of one) and notes what
the client received: per choice field (completion text, the delta's content and
reasoning_content, each tool call's name and arguments, finish_reason) the text so far, and
the stream's id, created and system_fingerprint. The regenerated stream is read against
that: events whose content the client already has are dropped, the one that crosses the
boundary is cut (text fields only; a tool call must cross at an event boundary), and from
there every event passes with the original id/created/system_fingerprint. Content that
differs from what was sent (`Mismatch`) ends the stream with the usual one SSE error.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

TRIMMABLE = ("text", "content", "reasoning_content")
KEEP = ("id", "created", "system_fingerprint")


class Mismatch(Exception):
    """The regenerated stream does not continue what the client received."""


def resumable(kind: str, body) -> bool:
    if kind not in ("chat", "completion") or not isinstance(body, dict):
        return False
    t, seed = body.get("temperature"), body.get("seed")
    greedy = isinstance(t, (int, float)) and not isinstance(t, bool) and t == 0
    if not (greedy or (isinstance(seed, int) and not isinstance(seed, bool))):
        return False
    if body.get("n", 1) not in (1, None) or body.get("best_of", 1) not in (1, None):
        return False
    return not body.get("logprobs") and not body.get("top_logprobs")


def _fields(choice: dict) -> dict[str, str]:
    """One choice's content in this event, by field (finish_reason as a field too)."""
    out: dict[str, str] = {}
    if isinstance(choice.get("text"), str):
        out["text"] = choice["text"]
    d = choice.get("delta")
    delta: dict = d if isinstance(d, dict) else {}
    for f in ("content", "reasoning_content"):
        if isinstance(delta.get(f), str):
            out[f] = delta[f]
    for tc in delta.get("tool_calls") or []:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if isinstance(fn, dict):
            key = f"tool{tc.get('index', 0)}"
            out[key] = out.get(key, "") + (fn.get("name") or "") + (fn.get("arguments") or "")
    if choice.get("finish_reason"):
        out["finish"] = str(choice["finish_reason"])
    return out


def _add(cum: dict[str, str], obj: dict) -> dict[str, str]:
    out = dict(cum)
    for ch in obj.get("choices") or []:
        if isinstance(ch, dict):
            for k, v in _fields(ch).items():
                key = f"{ch.get('index', 0)}/{k}"
                out[key] = out.get(key, "") + v
    return out


def _payload(event: bytes) -> bytes | None:
    data = [ln[6:] for ln in event.split(b"\n") if ln.startswith(b"data: ")]
    return b"\n".join(data) if data else None


def _json(event: bytes) -> dict | None:
    p = _payload(event)
    if p is None or not p.startswith(b"{"):
        return None
    try:
        obj = json.loads(p)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def encode(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


class Events:
    """Splits a byte stream into whole SSE events."""
    def __init__(self):
        self.buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        self.buf += chunk.replace(b"\r\n", b"\n")
        out = []
        while b"\n\n" in self.buf:
            ev, self.buf = self.buf.split(b"\n\n", 1)
            out.append(ev + b"\n\n")
        return out


@dataclass
class Track:
    """What the client received of a stream."""
    sent: dict[str, str] = field(default_factory=dict)
    events: int = 0                     # events with choices
    usage: bool = False                 # the final usage event (no choices) was sent
    ids: dict = field(default_factory=dict)

    def note(self, event: bytes) -> None:
        obj = _json(event)
        if obj is None or "choices" not in obj:
            return
        if not self.ids:
            self.ids = {k: obj[k] for k in KEEP if k in obj}
        if obj["choices"]:
            self.sent = _add(self.sent, obj)
            self.events += 1
        else:
            self.usage = True


class Replay:
    """Reads a regenerated stream against `track`; `feed` gives the events to send on
    (noting them in `track`, so a second failure resumes from there) or raises Mismatch."""
    def __init__(self, track: Track):
        self.t = track
        self.cum: dict[str, str] = {}
        self.live = track.events == 0
        self.split = Events()

    def feed(self, chunk: bytes) -> list[bytes]:
        out = []
        for ev in self.split.feed(chunk):
            obj = _json(ev)
            if obj is None or "choices" not in obj:
                out.append(ev)          # [DONE], a worker's own error event
                continue
            for k in KEEP:
                if k in obj and k in self.t.ids:
                    obj[k] = self.t.ids[k]
            if obj["choices"] and not self._catch_up(obj):
                continue
            if not obj["choices"] and not self.live:
                raise Mismatch("the regenerated stream ended before what the client has")
            if not obj["choices"] and self.t.usage:
                continue                # the client has the usage event already
            enc = encode(obj)
            self.t.note(enc)
            out.append(enc)
        return out

    def _catch_up(self, obj: dict) -> bool:
        """Whether `obj` (cut to what the client lacks) is to be sent."""
        prev, cur = self.cum, _add(self.cum, obj)
        self.cum = cur
        if self.live:
            return True
        sent = self.t.sent
        keys = set(cur) | set(sent)
        if cur == prev:
            return False                # no content (the role event): the client has it
        if all(sent.get(k, "").startswith(cur.get(k, "")) for k in keys):
            self.live = cur == sent
            return False
        if not all(cur.get(k, "").startswith(sent.get(k, "")) for k in keys):
            raise Mismatch("the regenerated content differs from what was sent")
        for k in keys:
            cut = len(sent.get(k, "")) - len(prev.get(k, ""))
            if cut > 0:
                self._cut(obj, k, cut)
        self.live = True
        return True

    @staticmethod
    def _cut(obj: dict, key: str, n: int) -> None:
        index, name = key.split("/", 1)
        if name not in TRIMMABLE:
            raise Mismatch(f"a {name} crosses what was sent mid-event")
        for ch in obj["choices"]:
            if str(ch.get("index", 0)) == index:
                holder = ch if name == "text" else ch["delta"]
                holder[name] = holder[name][n:]
