"""ScheduledChunk: the tokens one request computes in one engine step, as the scheduler
planned them. Bookkeeping only; the runner turns a step's chunks into tensors."""
from __future__ import annotations

from dataclasses import dataclass, field

from .sequence import Sequence


@dataclass(eq=False)
class ScheduledChunk:
    """Positions [start, start + n) of `seq`. A decode chunk with `draft` computes the
    sequence's last known token, then the draft tokens (guesses to verify, not part of the
    sequence): its last len(draft) positions. Identity equality: a step's chunks key the
    decode step's verdicts (`DecodeStep.settle`)."""
    seq: Sequence
    start: int          # first position computed this step
    n: int              # tokens computed this step
    sample: bool        # this chunk ends at the last known token: sample the next one
    draft: list[int] = field(default_factory=list)
