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

import concurrent.futures
from abc import ABC, abstractmethod
from collections.abc import Callable

from ..gpu.sampling import greedy_under_grammar_only, sample_seqs
from .sequence import TokenLogprob


def ensure_matcher(seq):
    """The request's grammar matcher, made on first use (None without a constraint)."""
    c = seq.params.constraint
    if c is not None and seq.matcher is None:
        seq.matcher = c.matcher()
        seq.matcher.consume(seq.output_ids)     # (empty, unless a caller pre-filled output)
    return seq.matcher


def _start_masks(seqs: list) -> Callable[[], list]:
    """Start computing the grammar mask of each request's next token (None without a
    constraint, or for a None entry), all in one batch off this thread, and return what waits for
    them, so that they overlap the forward (a matcher's state is final once the previous
    step settled). Matchers are made here, on the engine thread."""
    idx, matchers = [], []
    for i, s in enumerate(seqs):
        if s is None or ensure_matcher(s) is None:
            continue
        idx.append(i)
        matchers.append(s.matcher)
    out: list = [None] * len(seqs)
    if not matchers:
        return lambda: out
    from ..structured.matcher import batch_allowed
    fut = _mask_thread().submit(batch_allowed, matchers)

    def wait() -> list:
        rows = fut.result()
        for j, i in enumerate(idx):
            out[i] = rows[j]
        return out
    return wait


def _grammar_first_greedy(head, hidden, seqs: list, rows: list[int], allowed: list
                          ) -> dict[int, int]:
    """Tokens of greedy rows under a grammar alone, without a mask where possible: the
    unconstrained argmax, kept when it is in the grammar's mask (`takes_freely`: it is then
    the argmax over the allowed tokens too, the lowest id on a tie either way). The other
    rows get their masks in `allowed` (one batch) and are left to `sample_seqs`."""
    if not rows:
        return {}
    import torch
    fixed, refused = {}, []
    for i, t in zip(rows, head.greedy(hidden[torch.tensor(rows)])):
        if ensure_matcher(seqs[i]).takes_freely(t):
            fixed[i] = t
        else:
            refused.append(i)
    if refused:
        from ..structured.matcher import batch_allowed
        for i, row in zip(refused, batch_allowed([seqs[i].matcher for i in refused])):
            allowed[i] = row
    return fixed


_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _mask_thread() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mimo-grammar")
    return _pool


def record(seq, emitted: list[int], logprobs: list | None) -> None:
    """What a request keeps of a step besides its tokens: their logprobs (one tuple per
    emitted token, from `token_logprob`) and its grammar's advance."""
    if seq.params.logprobs is not None and logprobs is not None:
        seq.logprobs.extend(TokenLogprob(*lp) for lp in logprobs[:len(emitted)])
    if seq.matcher is not None and emitted:
        seq.matcher.consume(emitted)


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
    temperature / top-p / top-k and generator, after its logit processors (grammar,
    logit_bias, min_tokens, penalties); its logprobs recorded when asked."""

    def execute(self, runner, head, chunks: list) -> list[list[int]]:
        sampled = [c for c in chunks if c.sample]
        seqs = [c.seq for c in sampled]
        # Greedy rows under a grammar alone, where it forces nothing, try the unconstrained
        # argmax first (no mask); the others' masks are computed while the forward runs.
        lazy = [i for i, s in enumerate(seqs) if greedy_under_grammar_only(s.params)
                and not ensure_matcher(s).forced]
        skip = set(lazy)
        masks = _start_masks([None if i in skip else s for i, s in enumerate(seqs)])
        try:
            hidden = runner.execute(chunks)
        finally:
            allowed = masks()       # even when the forward failed: no mask still running
        fixed = _grammar_first_greedy(head, hidden, seqs, lazy, allowed)
        tokens, lps = sample_seqs(head, hidden, seqs, allowed, fixed)
        self._pending = {id(c): lp for c, lp in zip(sampled, lps) if lp is not None}
        return [[t] for t in tokens]

    def settle(self, chunk, emitted: list[int]) -> int | None:
        lp = getattr(self, "_pending", {}).pop(id(chunk), None)
        record(chunk.seq, emitted, None if lp is None else [lp])
        return None

    def finished(self, seq) -> None:
        seq.matcher = None
