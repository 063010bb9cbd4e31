"""The interface every draft proposer implements (n-gram lookup, MTP layers).

Contract, in the order the engine calls the hooks for one request:

  on_prefill(seq, start, n, hidden)
      after each prefill chunk of the prompt ran: positions [start, start + n). `hidden` is
      the target's final hidden states of those positions [n, hidden_size] when the drafter
      sets `needs_hidden`, else None. A model-based drafter (MTP) runs its own layers over
      them here, so its KV is valid from the first prompt token (MiMo-V2.5 report, 5.2: a
      drafter without prefill KV predicts badly for the first ~128 output tokens).
  propose(seqs, k) -> drafts
      before a decode step, once for every request in decode; up to k tokens each (fewer,
      even none, is fine). It must not modify the sequences. The engine may cut a draft
      short (token budget, max_tokens), so nothing may be assumed about how much is used.
  on_verified(seq, start, accepted, hidden)
      after the target verified the draft in one forward. `accepted`: the tokens appended
      to the request this step (accepted drafts, then the target's own token; cut at a stop
      token). Positions [start, start + len(accepted)) now hold the target's KV: position
      `start` was the last known token, the rest the accepted drafts; everything the drafter
      computed past them must be treated as rolled back. `hidden`: the target's final
      hidden states of those kept positions [len(accepted), hidden_size] (needs_hidden),
      else None.
  on_step_end()
      once per engine step after every chunk's on_prefill / on_verified and before the
      scheduler commits (SWA window release, rollback): work batched over the step's requests.
  on_finished(seq)
      exactly once per request that reached the engine, whatever ended it (stop, length,
      abort, error): free per-request state (an MTP drafter's KV pages).

A drafter never sees rejected tokens as part of a sequence: `seq.all_ids` only ever grows by
verified tokens, so a stateless-by-construction drafter (n-gram) needs no rollback at all.
"""
from __future__ import annotations

from abc import ABC, abstractmethod


class Drafter(ABC):
    # True: the engine computes and passes the target's hidden states (costs one gather).
    needs_hidden: bool = False
    # True: drafts are sampled from a distribution q and `draft_probs` returns it; False:
    # drafts are deterministic (q is a point mass on the proposed token).
    has_probs: bool = False
    # Most drafts it can make per step (None: any number); the engine clamps to it.
    max_draft: int | None = None
    # Positions behind the computed length whose SWA-pool KV it still reads (its own layers).
    swa_lag: int = 0

    @abstractmethod
    def propose(self, seqs: list, k: int) -> list[list[int]]:
        """Up to k draft tokens for each sequence, in order."""

    def draft_probs(self, seq):
        """[len(draft), vocab] probabilities the last proposal for `seq` was drawn from."""
        raise NotImplementedError

    def on_prefill(self, seq, start: int, n: int, hidden) -> None:  # noqa: B027 (optional hook)
        pass

    def on_verified(self, seq, start: int, accepted: list[int], hidden) -> None:  # noqa: B027 (optional hook)
        pass

    def on_step_end(self) -> None:  # noqa: B027 (optional hook)
        pass

    def on_finished(self, seq) -> None:  # noqa: B027 (optional hook)
        pass
