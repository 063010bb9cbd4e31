"""MTPDrafter: drafts from the model's own multi-token-prediction layers (MiMo-V2-Flash).

Layer k at position p combines h_{k-1}(p) (the target's final hidden state for k = 0, layer
k-1's output after it) with token p + k + 1 and predicts token p + k + 2; it attends over its
own KV (an SWA-pool layer) at the same positions as the target (see `mtp_forward`).

Per request and layer k we keep a frontier `valid[k]`: layer k's KV of positions below it is
"teacher-forced" (computed from verified tokens and verified hidden states, exactly what a
plain forward over the sequence gives), and `pend[k]`, the h_{k-1} rows of positions from
`valid[k]` on that wait for their token p + k + 1. With M computed positions and M + 1 known
tokens, layer k can run up to position M - k - 1, so it trails the target by k positions.
That work runs at the end of every step that gave a request hidden states (prefill chunks:
the MiMo-V2.5 report's point, drafts are good from output token 0; verifications: the
accepted tokens), batched over the step's requests (`on_step_end`), and before a
proposal (`propose`: the position before the token the prefill's last chunk sampled).

A proposal from position M - 1: d1 = head(h_0(M - 1)); layer k then runs over positions
[M - k, M) with the draft tokens d1..dk, writing speculative KV there, and d_{k+1} = head of its
last row. Those positions are at or past `valid[k]`, so the next teacher-forced pass overwrites
them before anything reads them (attention writes a row's KV before it attends): nothing of a
rejected draft survives, and no KV is ever written past the computed length M (the scheduler's
truncation only frees pages past M).

Layer k reads KV up to K positions behind the computed length (its teacher-forced pass runs
before the scheduler's commit, at most k + 1 behind the previous length), so the scheduler
keeps `swa_lag` = K more positions of SWA than the target needs.

Prefix-cache hits (and resumed preempted requests) start prefill at s > 0 with no hidden
states for [0, s): the MTP KV in the cached SWA pages is not trusted. K/V of a row depend only
on that row's inputs, so layer 0's KV is exact from s on, its outputs from s + window - 1 on,
layer k's outputs from s + (k + 1)(window - 1) on. The drafter proposes only drafts whose
whole chain is exact by that bound (fewer, or none, right after a hit); greedy output is
unaffected either way, since the target verifies every draft. (The trailing teacher-forced
pass may write MTP KV into prompt pages the prefix cache already shares; only MTP slots, which
no other request trusts, and never the target's.)
"""
from __future__ import annotations

import weakref

import torch

from ..models.context import ForwardContext
from .drafter import Drafter


class _State:
    __slots__ = ("kv", "trusted_from", "valid", "pend")

    def __init__(self, kv, start: int, K: int, empty: torch.Tensor):
        self.kv = kv                     # the SeqKV it was built for: a new one means re-prefill
        self.trusted_from = start        # first position with a target hidden state
        self.valid = [start] * K
        # pend[k] (k < K): h_{k-1} rows from position valid[k] on; pend[K]: the last output
        # of layer K-1 (kept only to keep the bookkeeping uniform).
        self.pend = [empty] * (K + 1)


class MTPDrafter(Drafter):
    needs_hidden = True

    def __init__(self, model, runner, num_layers: int | None = None):
        self.model = model
        self.runner = runner
        self.K = len(model.mtp) if num_layers is None else min(num_layers, len(model.mtp))
        if self.K < 1:
            raise ValueError("MTPDrafter needs a model with MTP layers")
        self.max_draft = self.K          # one draft per MTP layer: the chain ends there
        self.swa_lag = self.K
        self.window = runner.window
        self._empty = torch.empty(0, model.cfg.hidden_size, dtype=runner.mask_dtype,
                                  device=runner.device)
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._todo: list = []            # (seq, state) given hidden states this step

    # ---- engine hooks ---------------------------------------------------------------------
    def on_prefill(self, seq, start: int, n: int, hidden) -> None:
        st = self._states.get(seq)
        if st is None or st.kv is not seq.kv or start == 0:
            st = self._states[seq] = _State(seq.kv, start, self.K, self._empty)
        self._take_hidden(st, start, hidden)
        self._todo.append((seq, st))

    def on_verified(self, seq, start: int, accepted: list[int], hidden) -> None:
        st = self._states.get(seq)
        if st is None or hidden is None:
            return
        self._take_hidden(st, start, hidden)
        self._todo.append((seq, st))

    def on_step_end(self) -> None:
        # Before the scheduler's commit releases SWA behind the new lengths (layer k restarts
        # at start - k, up to K + 1 + k positions behind the new length); one forward per
        # layer for all the step's requests. A request that just finished needs no more.
        todo, self._todo = self._todo, []
        self._advance([(s, st) for s, st in todo if s.finish_reason is None])

    def on_finished(self, seq) -> None:
        self._states.pop(seq, None)

    def propose(self, seqs: list, k: int) -> list[list[int]]:
        live = [(s, self._states.get(s)) for s in seqs]
        live = [(s, st) for s, st in live if st is not None and st.kv is s.kv]
        self._advance(live)
        out = {id(s): [] for s in seqs}
        # Chain only the requests whose first draft is exact (see the module docstring).
        chain = [(s, st) for s, st in live
                 if self._exact_drafts(s, st) > 0 and st.valid[0] == s.num_computed]
        if k <= 0 or not chain:
            return [out[id(s)] for s in seqs]
        head = self.model.lm_head
        last = torch.cat([st.pend[1][-1:] for _, st in chain])
        drafts = [[t] for t in head.greedy(last)]
        spec = [self._empty[:0]] * len(chain)       # h_{j-1} at positions [M - j + 1, M)
        for j in range(1, min(k, self.K)):
            items = []
            for (s, st), d, h in zip(chain, drafts, spec):
                M = s.num_computed
                items.append((s, M - j, d[:j], torch.cat([st.pend[j][:1], h])))
            spec = self._run(j, items)
            for d, h in zip(drafts, head.greedy(torch.cat([h[-1:] for h in spec]))):
                d.append(h)
        for (s, st), d in zip(chain, drafts):
            out[id(s)] = d[:self._exact_drafts(s, st)]
        return [out[id(s)] for s in seqs]

    # ---- internals ------------------------------------------------------------------------
    def state(self, seq):
        return self._states.get(seq)

    def _exact_drafts(self, seq, st: _State) -> int:
        """How many chained drafts are exact given where the target's hidden states start."""
        if st.trusted_from == 0:
            return self.K
        # Draft j + 1 comes from layer j at positions >= M - j, whose output is exact from
        # trusted_from + (j + 1)(window - 1) on.
        M = seq.num_computed
        n = 0
        while n < self.K and M - n >= st.trusted_from + (n + 1) * (self.window - 1):
            n += 1
        return n

    @staticmethod
    def _take_hidden(st: _State, start: int, hidden: torch.Tensor) -> None:
        have = st.valid[0] + len(st.pend[0])
        if start != have:
            raise RuntimeError(f"MTP drafter: hidden states for position {start}, "
                               f"expected {have}")
        st.pend[0] = torch.cat([st.pend[0], hidden.detach()])

    def _advance(self, live: list) -> None:
        """Teacher-forced pass: every layer over every position whose token p + k + 1 is
        known (verified), layer by layer so layer k's outputs feed layer k + 1."""
        for k in range(self.K):
            items, owners = [], []
            for s, st in live:
                a = st.valid[k]
                b = min(a + len(st.pend[k]), s.num_tokens - k - 1)
                if b > a:
                    items.append((s, a, s.all_ids[a + k + 1:b + k + 1], st.pend[k][:b - a]))
                    owners.append((st, a, b))
            if not items:
                continue
            for (st, a, b), h in zip(owners, self._run(k, items)):
                st.valid[k] = b
                st.pend[k] = st.pend[k][b - a:]
                st.pend[k + 1] = h[-1:] if k + 1 == self.K else torch.cat([st.pend[k + 1], h])

    def _run(self, k: int, items: list) -> list[torch.Tensor]:
        """MTP layer k over (seq, first position, tokens, h_{k-1} rows) items in one forward;
        returns each item's output rows. Writes layer k's KV at those positions."""
        dev = self.runner.device
        ids, pos = [], []
        for _, a, toks, _ in items:
            ids.extend(toks)
            pos.extend(range(a, a + len(toks)))
        batch = self.runner.swa_batch([(s, a, len(toks)) for s, a, toks, _ in items])
        ctx = ForwardContext(self.runner.kv, {"swa": batch}, self.runner.backend)
        out = self.model.mtp_forward(k, torch.tensor(ids, dtype=torch.int64, device=dev),
                                     torch.tensor(pos, dtype=torch.int64, device=dev),
                                     torch.cat([h for *_, h in items]), ctx)
        res, row = [], 0
        for _, _, toks, _ in items:
            res.append(out[row:row + len(toks)])
            row += len(toks)
        return res
