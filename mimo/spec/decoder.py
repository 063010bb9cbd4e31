"""SpecDecoder: the engine's side of speculative decoding, around one `Drafter`.

Per engine step: `propose` drafts for every request in decode (the scheduler turns each into
one chunk of last token + drafts, so all drafts of all requests are verified in the same
forward as the prefill chunks), `execute` runs the target and returns the tokens each sampled
chunk would append, the engine appends them up to a stop, and `settle` records what was kept:
it returns how many positions of the chunk keep their KV (the engine hands that to the
scheduler's commit, which rolls the rest back), and the drafter hears the verdict.
"""
from __future__ import annotations

import torch

from ..engine.decode_step import DecodeStep
from ..gpu.sampling import filtered_probs, sample_row
from .drafter import Drafter
from .rejection import greedy_accept, rejection_sample
from .stats import SpecStats


class SpecDecoder(DecodeStep):
    """The speculative `DecodeStep` (see `mimo/engine/decode_step.py`)."""

    def __init__(self, drafter: Drafter, num_draft_tokens: int):
        self.drafter = drafter
        # A drafter may cap the drafts per step (MTP: one per layer); more are clamped, not refused.
        cap = getattr(drafter, "max_draft", None)
        self.k = num_draft_tokens if cap is None else min(num_draft_tokens, cap)
        self.num_draft = self.k
        self.swa_lag = drafter.swa_lag
        self.totals = SpecStats()          # every request's steps, summed (metrics)
        self._rows: dict[int, tuple[int, int]] = {}   # id(chunk) -> (first verify row, drafts accepted)
        self._hidden: torch.Tensor | None = None

    def propose(self, running: list) -> dict:
        """Drafts for the requests that will decode this step (the scheduler may shorten them)."""
        seqs = [s for s in running if not s.in_prefill and s.finish_reason is None]
        if not seqs:
            return {}
        return {s: list(d[:self.k]) for s, d in zip(seqs, self.drafter.propose(seqs, self.k))}

    def execute(self, runner, head, chunks: list) -> list[list[int]]:
        """Run the target once over `chunks`; tokens to append for each chunk with `sample`."""
        needs = self.drafter.needs_hidden
        hidden = runner.execute(chunks, all_logits=needs)
        spans, row = [], 0
        for c in chunks:
            m = 1 + len(c.draft)
            if needs:
                if c.start < c.seq.prefill_end:
                    self.drafter.on_prefill(c.seq, c.start, c.n, hidden[row:row + c.n])
                row += c.n
                if c.sample:
                    spans.append((c, row - m))
            elif c.sample:
                spans.append((c, row))
                row += m
        self._hidden = hidden if needs else None
        out: dict[int, list[int]] = {}
        greedy = [(c, r) for c, r in spans if c.seq.params.greedy]
        if greedy:
            rows = [r + i for c, r in greedy for i in range(1 + len(c.draft))]
            target = head.greedy(hidden.index_select(0, torch.tensor(rows)))
            j = 0
            for c, _ in greedy:
                m = 1 + len(c.draft)
                out[id(c)] = greedy_accept(c.draft, target[j:j + m])
                j += m
        rest = [(c, r) for c, r in spans if not c.seq.params.greedy]
        if rest:
            rows = [r + i for c, r in rest for i in range(1 + len(c.draft))]
            logits = head.logits(hidden.index_select(0, torch.tensor(rows)))
            j = 0
            for c, _ in rest:
                p, m = c.seq.params, 1 + len(c.draft)
                if not c.draft:   # exactly what plain sampling does, same generator draws
                    out[id(c)] = [sample_row(logits[j], p.temperature, p.top_p, p.top_k,
                                             c.seq.generator)]
                else:
                    probs = torch.stack([filtered_probs(logits[j + i], p.temperature, p.top_p,
                                                        p.top_k) for i in range(m)])
                    q = self.drafter.draft_probs(c.seq) if self.drafter.has_probs else None
                    out[id(c)] = rejection_sample(c.draft, probs, c.seq.generator, q)
                j += m
        self._rows = {id(c): (r, len(out[id(c)]) - 1) for c, r in spans}
        return [out[id(c)] for c, _ in spans]

    def settle(self, chunk, emitted: list[int]) -> int | None:
        """`emitted`: the tokens actually appended for `chunk` (cut at a stop). Returns
        the positions whose KV stays: the last known token and the accepted drafts."""
        seq = chunk.seq
        if chunk.start < seq.prefill_end:
            return None                 # the prompt's last chunk: nothing was drafted
        r, accepted = self._rows.pop(id(chunk))
        # Position start holds the last known token; start + i the i-th accepted draft.
        if seq.spec_stats is None:
            seq.spec_stats = SpecStats()
        for s in (seq.spec_stats, self.totals):
            s.record(len(chunk.draft), accepted, len(emitted))
        hidden = None
        if self._hidden is not None:
            hidden = self._hidden[r:r + len(emitted)]
        self.drafter.on_verified(seq, chunk.start, list(emitted), hidden)
        return len(emitted)

    def end_step(self) -> None:
        """Every chunk is settled; the scheduler commits next."""
        self.drafter.on_step_end()

    def finished(self, seq) -> None:
        self.drafter.on_finished(seq)
