"""Incremental detokenization: token ids in, text deltas out, UTF-8 safe, with stop strings.

A multi-byte character can span tokens; its partial bytes decode to U+FFFD, so a trailing
U+FFFD is held back until the next token completes it. Text that could be the start of a
stop string is held back too, so a stop string is never half-emitted.

Each token decodes only a short window, not the whole output (which cost O(length) a token:
0.5 ms at 2,000 tokens, on the event loop): the tokens since the last committed point are
decoded with the window before them, and the new text is what follows that window's own
decoding (both start at the same token, so a tokenizer's start-of-text rules apply to both
alike). The point moves on only where the text does not end in a partial character.
"""
from __future__ import annotations

from ..pipeline import Stage
from .chat_request import ChatRequest


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop: list[str] | None = None, skip_special_tokens: bool = True):
        self.tok = tokenizer
        self.stop = [s for s in (stop or []) if s]
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.emitted = 0          # characters of the decoded text already returned
        self.text = ""
        self.stopped = False      # a stop string was found; the request must end
        # ids[:read] decode to `committed`; ids[prefix:read] is the window decoded with the
        # tokens after it (both offsets sit where no character is partial).
        self.committed = ""
        self.prefix = 0
        self.read = 0

    def _decode(self) -> str:
        """The text of all ids so far, from a window's decoding."""
        window = self.tok.decode(self.ids[self.prefix:self.read], skip_special_tokens=self.skip)
        new = self.tok.decode(self.ids[self.prefix:], skip_special_tokens=self.skip)
        text = self.committed + new[len(window):]
        if not new.endswith("\ufffd"):
            self.committed, self.prefix, self.read = text, self.read, len(self.ids)
        return text

    def feed(self, token_ids: list[int], final: bool = False) -> str:
        """Add tokens; return the newly safe text. After a stop string, returns what precedes
        it and sets `stopped`."""
        if self.stopped:
            return ""
        self.ids.extend(token_ids)
        text = self._decode()
        self.text = text
        for s in self.stop:
            # A stop string can only appear in text not yet emitted (or straddling it).
            i = text.find(s, max(0, self.emitted - len(s) + 1))
            if i != -1:
                self.stopped = True
                self.text = text[:i]
                out = text[self.emitted:i] if i > self.emitted else ""
                self.emitted = max(self.emitted, i)
                return out
        safe = len(text)
        if not final:
            while safe > self.emitted and text[safe - 1] == "\ufffd":
                safe -= 1
            for s in self.stop:
                for k in range(min(len(s) - 1, safe - self.emitted), 0, -1):
                    if text[safe - k:safe] == s[:k]:
                        safe -= k
                        break
        if safe <= self.emitted:
            return ""
        out = text[self.emitted:safe]
        self.emitted = safe
        return out


class TextDelta(tuple):
    """(text, finish_reason | None), carrying the tokens behind it and their logprobs (when
    asked) as attributes: unpacks as the pair it always was."""
    token_ids: list[int]
    logprobs: list

    def __new__(cls, text: str, finish_reason: str | None, token_ids=(), logprobs=()):
        self = super().__new__(cls, (text, finish_reason))
        self.token_ids, self.logprobs = list(token_ids), list(logprobs)
        return self

    @property
    def text(self) -> str:
        return self[0]

    @property
    def finish_reason(self) -> str | None:
        return self[1]


class Detokenize(Stage):
    """Streaming stage: engine events in, TextDelta (text delta, finish_reason | None) out;
    writes req.completion_tokens. `end_ids`: the tokens that end a request (EOS), left out of
    the text of a request that keeps special tokens."""
    name = "detokenize"

    def __init__(self, tokenizer, end_ids: frozenset[int] = frozenset()):
        super().__init__()
        self.tokenizer = tokenizer
        self.end_ids = end_ids

    async def process(self, req: ChatRequest, upstream):
        detok = IncrementalDetokenizer(self.tokenizer, req.stop,
                                       skip_special_tokens=not req.keep_special)
        count = 0
        ends = self.end_ids | set(req.params.stop_token_ids)
        async for ev in upstream:
            final = ev.finish_reason is not None
            ids = list(ev.token_ids)
            count += len(ids)
            if req.keep_special and final and ids and ids[-1] in ends:
                ids = ids[:-1]
            delta = detok.feed(ids, final=final)
            req.completion_tokens = count
            lps = getattr(ev, "logprobs", ())
            if detok.stopped:
                yield TextDelta(delta, "stop", ev.token_ids, lps)
                return          # closing the upstream aborts the request in the engine
            if delta or final or ev.token_ids:
                yield TextDelta(delta, ev.finish_reason, ev.token_ids, lps)
