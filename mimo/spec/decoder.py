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

from ..engine.decode_step import DecodeStep, ensure_matcher, record
from ..gpu.sampling import filtered_probs, process_logits, sample_row, token_logprob
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
        self._lps: dict[int, list] = {}     # id(chunk) -> token_logprob per verify row

    def propose(self, running: list) -> dict:
        """Drafts for the requests that will decode this step (the scheduler may shorten
        them). A request under a grammar keeps only the draft prefix its grammar accepts:
        the rest could never be accepted, so verifying it would waste the forward. Only for
        drafters without draft probabilities: under rejection sampling a refused draft is
        resampled from the residual, and cutting it would sample from the target instead,
        which is not the same distribution."""
        seqs = [s for s in running if not s.in_prefill and s.finish_reason is None]
        if not seqs:
            return {}
        out = {s: list(d[:self.k]) for s, d in zip(seqs, self.drafter.propose(seqs, self.k))}
        for s, d in out.items():
            if d and s.params.constraint is not None and not self.drafter.has_probs:
                out[s] = d[:ensure_matcher(s).valid_prefix(d)]
        return out

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
        self._lps = {}
        greedy = [(c, r) for c, r in spans if c.seq.params.greedy and not c.seq.params.needs_logits]
        if greedy:
            rows = [r + i for c, r in greedy for i in range(1 + len(c.draft))]
            target = head.greedy(hidden.index_select(0, torch.tensor(rows, device=hidden.device)))
            j = 0
            for c, _ in greedy:
                m = 1 + len(c.draft)
                out[id(c)] = greedy_accept(c.draft, target[j:j + m])
                j += m
        rest = [(c, r) for c, r in spans if id(c) not in out]
        if rest:
            rows = [r + i for c, r in rest for i in range(1 + len(c.draft))]
            logits = head.logits(hidden.index_select(0, torch.tensor(rows, device=hidden.device)))
            j = 0
            for c, _ in rest:
                m = 1 + len(c.draft)
                out[id(c)] = self._verify(c, logits[j:j + m])
                j += m
        self._rows = {id(c): (r, len(out[id(c)]) - 1) for c, r in spans}
        return [out[id(c)] for c, _ in spans]

    def _verify(self, c, raw: torch.Tensor) -> list[int]:
        """The tokens a chunk appends, from its raw logits [1 + drafts, V]: each position
        processed as plain decoding would process it had the drafts before it been sampled
        (penalty counts and grammar state include them), then greedy acceptance or
        rejection sampling. Logprobs come from the raw rows (the target's distribution)."""
        seq, p, draft = c.seq, c.seq.params, c.draft
        m = 1 + len(draft)
        x = raw
        if p.processes_logits:
            masks = _verify_masks(seq, draft)
            x = torch.stack([process_logits(raw[i], p, seq.prompt_ids,
                                            seq.output_ids + draft[:i], seq.eos_ids, masks[i])
                             for i in range(m)])
        if p.greedy:
            toks = greedy_accept(draft, torch.argmax(x, dim=-1).tolist())
        elif not draft:     # exactly what plain sampling does, same generator draws
            toks = [sample_row(x[0], p.temperature, p.top_p, p.top_k, seq.generator, p.min_p)]
        else:
            probs = torch.stack([filtered_probs(x[i], p.temperature, p.top_p, p.top_k, p.min_p)
                                 for i in range(m)])
            q = self.drafter.draft_probs(seq) if self.drafter.has_probs else None
            toks = rejection_sample(draft, probs, seq.generator, q)
        if p.logprobs is not None:
            self._lps[id(c)] = [token_logprob(raw[i], t, p.logprobs) for i, t in enumerate(toks)]
        return toks

    def settle(self, chunk, emitted: list[int]) -> int | None:
        """`emitted`: the tokens actually appended for `chunk` (cut at a stop). Returns
        the positions whose KV stays: the last known token and the accepted drafts."""
        seq = chunk.seq
        record(seq, emitted, self._lps.pop(id(chunk), None))
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
        seq.matcher = None
        self.drafter.on_finished(seq)


def _verify_masks(seq, draft: list[int]) -> list:
    """The grammar mask at each verify position (None without a grammar): position i sees the
    output plus draft[:i]. The matcher is advanced through the drafts and rolled back, so it
    ends where it began. Past the first draft the grammar refuses (propose already cut
    there, so only if the scheduler's draft differs) the masks repeat: that position bans
    the draft, so nothing after it is ever accepted."""
    if seq.params.constraint is None:
        return [None] * (1 + len(draft))
    m = ensure_matcher(seq)
    ok = m.valid_prefix(draft)
    masks = []
    for i in range(1 + len(draft)):
        if i <= ok:
            masks.append(m.allowed())
            if i < ok:
                m.consume([draft[i]])
        else:
            masks.append(masks[-1])
    m.rollback(ok)
    return masks
