"""The multimodal part of a prompt, as the runner needs it: rope positions for every prompt
token (one row per position axis), the offset decoding continues with, and the vision
embeddings that replace the placeholder tokens' embeddings. Built once per request (after
the encoder ran); the runner slices it per scheduled chunk, so chunked prefill may cut
through an image anywhere. Family-neutral: the vision adapter computes the positions."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch


@dataclass(eq=False)
class MMPrompt:
    positions: torch.Tensor     # [axes, prompt_len] int64
    delta: int                  # token i >= prompt_len sits at position i + delta
    rows: torch.Tensor          # [M] int64 ascending: prompt indices of media tokens
    embeds: torch.Tensor        # [M, hidden]: their embeddings, in the same order
    # Content hash of the media in prompt order (bytes + processor settings): the prefix
    # cache keys this prompt's KV under it, so only the same media in the same places share
    # KV. None: the request bypasses the prefix cache.
    cache_key: str | None = None

    @classmethod
    def assemble(cls, prompt_ids: Sequence[int], positions: torch.Tensor, delta: int,
                 embeds: Mapping[int, Sequence[torch.Tensor]]) -> MMPrompt:
        """`embeds`: per placeholder token id, the embeddings of the items it stands for,
        in prompt order, each with one row per placeholder token of its item. ValueError
        when rows and placeholders do not pair up."""
        ids = torch.as_tensor(list(prompt_ids), dtype=torch.int64)
        rows, embs = [], []
        for tok, items in embeds.items():
            at = torch.nonzero(ids == tok).squeeze(1)
            got = sum(int(e.shape[0]) for e in items)
            if got != at.numel():
                raise ValueError(f"{at.numel()} placeholder tokens {tok} but {got} embeddings")
            if got:
                rows.append(at)
                embs.append(torch.cat(list(items)))
        if not rows:
            return cls(positions, delta, torch.zeros(0, dtype=torch.int64), torch.zeros(0, 0))
        rows_t, emb_t = torch.cat(rows), torch.cat(embs)
        order = torch.argsort(rows_t)
        return cls(positions, delta, rows_t[order], emb_t[order])

    def chunk(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Tokens [start, start + n): positions [axes, n], the media rows among them
        (relative to start) and their embeddings."""
        axes, plen = self.positions.shape
        parts = []
        if start < plen:
            parts.append(self.positions[:, start:min(start + n, plen)])
        if start + n > plen:
            lo = max(start, plen)
            parts.append((torch.arange(lo, start + n) + self.delta).expand(axes, -1))
        pos = torch.cat(parts, dim=1)
        lo = int(torch.searchsorted(self.rows, start))
        hi = int(torch.searchsorted(self.rows, start + n))
        return pos, self.rows[lo:hi] - start, self.embeds[lo:hi]
