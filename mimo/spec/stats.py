"""Acceptance statistics of speculative decoding, per request and summed per engine.

A *step* is one verify forward of a decoding request (with or without a draft). Per step
the request emits its accepted drafts plus the target's own token, so

  mean_acceptance_length = emitted / steps        (tokens per step; 1.0 = no gain)
  position_rate[i]       = accepted[i] / drafted[i]  (how often the i-th draft token survives)
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    steps: int = 0
    emitted: int = 0
    drafted: list[int] = field(default_factory=list)     # per draft position
    accepted: list[int] = field(default_factory=list)    # per draft position

    def record(self, n_draft: int, n_accepted: int, n_emitted: int) -> None:
        self.steps += 1
        self.emitted += n_emitted
        grow = n_draft - len(self.drafted)
        if grow > 0:
            self.drafted.extend([0] * grow)
            self.accepted.extend([0] * grow)
        for i in range(n_draft):
            self.drafted[i] += 1
        for i in range(n_accepted):
            self.accepted[i] += 1

    def add(self, other: SpecStats) -> None:
        self.steps += other.steps
        self.emitted += other.emitted
        for i in range(len(other.drafted)):
            if i >= len(self.drafted):
                self.drafted.append(0)
                self.accepted.append(0)
            self.drafted[i] += other.drafted[i]
            self.accepted[i] += other.accepted[i]

    @property
    def draft_tokens(self) -> int:
        return sum(self.drafted)

    @property
    def accepted_tokens(self) -> int:
        return sum(self.accepted)

    @property
    def mean_acceptance_length(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0

    @property
    def position_rate(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted, self.drafted)]

    def as_dict(self) -> dict:
        return {"steps": self.steps, "emitted_tokens": self.emitted,
                "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                "mean_acceptance_length": round(self.mean_acceptance_length, 4),
                "acceptance_rate": round(self.accepted_tokens / self.draft_tokens, 4)
                if self.draft_tokens else 0.0,
                "position_rate": [round(r, 4) for r in self.position_rate]}
