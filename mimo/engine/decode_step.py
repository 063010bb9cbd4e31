"""The decode step of the engine loop (one of the `EngineParts`): runs the step's one
forward and turns it into tokens. Plain sampling, speculative verification, anything else:

    propose(running) -> {seq: draft tokens} | None   # before scheduling: tokens to verify
    execute(runner, head, chunks) -> [[tokens]]      # one forward; tokens per sampled chunk
    settle(chunk, emitted) -> kept | None            # what was appended (cut at a stop);
                                                     # kept: leading positions of the chunk
                                                     # whose KV stays (None: all of them)
    end_step()                                       # after every settle of a step
    finished(seq)                                    # the request is gone

`num_draft` tells the scheduler how many extra tokens a decode chunk may carry (it reserves
SWA for them); `swa_lag`, how many positions behind the computed length SWA release must
trail (a drafter with its own KV that lags the target, like MTP). The engine appends tokens
up to a stop, then commits the step, rolling back the KV of positions past `kept`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from ..gpu.sampling import sample


class DecodeStep(ABC):
    num_draft: int = 0
    swa_lag: int = 0

    def propose(self, running: list) -> dict | None:
        return None

    @abstractmethod
    def execute(self, runner, head, chunks: list) -> list[list[int]]:
        """Run the model once over `chunks`; the tokens to append for each chunk with
        `sample` set, in order."""

    def settle(self, chunk, emitted: list[int]) -> int | None:
        """`emitted`: the tokens appended for `chunk`. Returns how many leading positions
        of the chunk keep their KV (fewer than `chunk.n`: the rest is rolled back), or None
        to keep all."""
        return None

    def end_step(self) -> None:  # noqa: B027 (optional hook)
        pass

    def finished(self, seq) -> None:  # noqa: B027 (optional hook)
        pass


class PlainDecode(DecodeStep):
    """One token per sampled chunk: greedy (exact argmax) or sampled with the request's
    temperature / top-p / top-k and generator."""

    def execute(self, runner, head, chunks: list) -> list[list[int]]:
        sampled = [c for c in chunks if c.sample]
        hidden = runner.execute(chunks)
        tokens = sample(head, hidden, [c.seq.params for c in sampled],
                        [c.seq.generator for c in sampled])
        return [[t] for t in tokens]
