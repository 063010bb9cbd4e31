"""The decode step of the engine loop, as a pluggable object.

Each engine iteration is: prefix match (at admission, `kvcache.prefix_match.PrefixMatch`),
prefill chunks (sized by `engine.prefill_step.PrefillStep`) and decode tokens scheduled
together, then one forward for all of them, run and turned into tokens by the `DecodeStep`.
Swapping the decode step (plain sampling, speculative verification, anything else) touches
neither the scheduler nor the other two steps:

    propose(running) -> {seq: draft tokens} | None   # before scheduling: tokens to verify
    execute(runner, head, chunks) -> [[tokens]]      # one forward; tokens per sampled chunk
    settle(chunk, emitted)                           # what was appended (cut at a stop);
                                                     # set chunk.kept to roll back KV
    end_step()                                       # after every settle of a step
    finished(seq)                                    # the request is gone

`num_draft` tells the scheduler how many extra tokens a decode chunk may carry (it reserves
SWA for them); `swa_lag`, how many positions behind the computed length SWA release must
trail (a drafter with its own KV that lags the target, like MTP). The engine appends tokens up to a stop, then commits the step.
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

    def settle(self, chunk, emitted: list[int]) -> None:
        pass

    def end_step(self) -> None:
        pass

    def finished(self, seq) -> None:
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
