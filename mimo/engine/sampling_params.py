"""Per-request sampling settings, validated where they are made."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

MAX_LOGPROBS = 20           # top alternatives per position (OpenAI's top_logprobs limit)


@dataclass
class SamplingParams:
    """temperature 0 means greedy. top_k 0 (or -1) and top_p 1.0 disable those filters.
    Generation ends after `max_tokens` tokens, or at an EOS / `stop_token_ids` token (which
    is kept in the output) unless `ignore_eos`. Under a `constraint` the grammar wins: an EOS
    it allows ends the request even with `ignore_eos`, and `min_tokens` never bans the EOS
    of a complete document (the grammar allows nothing else there).

    Logit processing, in this order, before temperature / min_p / top-k / top-p:
    `constraint` (a grammar: disallowed tokens get -inf; anything with `matcher()`, see
    mimo.structured), `logit_bias` (token id -> added to its logit), `min_tokens` (EOS and
    stop tokens banned until that many tokens were generated), `repetition_penalty` (vLLM's:
    the logit of a token seen in the prompt or output is divided by it if positive, else
    multiplied), `frequency_penalty` and `presence_penalty` (OpenAI's: logit -= count *
    frequency + (count > 0) * presence, counts over the output so far). `min_p` drops tokens
    whose probability is below min_p times the top one's.

    `logprobs`: None (off), or how many top alternatives to report per token besides the
    chosen one (0..MAX_LOGPROBS). They are the target model's raw distribution (log-softmax
    of its logits, before any processing above)."""
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_p: float = 0.0
    min_tokens: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None
    constraint: Any = None

    def __post_init__(self):
        def bad(msg):
            raise ValueError(f"invalid sampling parameter: {msg}")

        def number(name, lo, hi, lo_open=False):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < lo or v > hi or (lo_open and v == lo):
                bad(f"{name} must be a finite number in {'(' if lo_open else '['}{lo}, {hi}], "
                    f"got {v!r}")

        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            bad(f"max_tokens must be an integer, got {self.max_tokens!r}")
        if self.max_tokens < 1:
            bad(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0 \
                or self.temperature != self.temperature or self.temperature == float("inf"):
            bad(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            bad(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            bad(f"top_k must be an integer >= -1 (0 or -1 disables it), got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            bad(f"seed must be an integer, got {self.seed!r}")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids must be non-negative integers")
        self.stop_token_ids = list(self.stop_token_ids)
        number("min_p", 0.0, 1.0)
        number("frequency_penalty", -2.0, 2.0)
        number("presence_penalty", -2.0, 2.0)
        number("repetition_penalty", 0.0, 2.0**31, lo_open=True)
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) \
                or not 0 <= self.min_tokens <= self.max_tokens:
            bad(f"min_tokens must be an integer in [0, max_tokens], got {self.min_tokens!r}")
        if not isinstance(self.logit_bias, dict) or any(
                isinstance(t, bool) or not isinstance(t, int) or t < 0 or isinstance(b, bool)
                or not isinstance(b, (int, float)) or not -100 <= b <= 100
                for t, b in self.logit_bias.items()):
            bad("logit_bias must map non-negative token ids to numbers in [-100, 100]")
        self.logit_bias = {int(t): float(b) for t, b in self.logit_bias.items()}
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(
                self.logprobs, int) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            bad(f"logprobs must be None or an integer in [0, {MAX_LOGPROBS}], "
                f"got {self.logprobs!r}")
        if self.constraint is not None and not callable(getattr(self.constraint, "matcher", None)):
            bad("constraint must have a matcher() method (see mimo.structured)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def processes_logits(self) -> bool:
        """Anything between the raw logits and temperature / top-k / top-p."""
        return bool(self.constraint is not None or self.logit_bias or self.min_tokens
                    or self.frequency_penalty or self.presence_penalty
                    or self.repetition_penalty != 1.0)

    @property
    def needs_logits(self) -> bool:
        """The step must materialise this request's logits (no argmax-only shortcut)."""
        return self.processes_logits or self.logprobs is not None or self.min_p > 0
