"""Per-request sampling settings, validated where they are made."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """temperature 0 means greedy. top_k 0 (or -1) and top_p 1.0 disable those filters.
    Generation ends after `max_tokens` tokens, or at an EOS / `stop_token_ids` token (which
    is kept in the output) unless `ignore_eos`."""
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self):
        def bad(msg):
            raise ValueError(f"invalid sampling parameter: {msg}")
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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
