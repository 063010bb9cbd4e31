"""The arbiter of `bench agree`: where mimo's greedy tokens and llama-server's part, what
exact float32 math on the same weights picks there.

Both servers compute with the GGUF's blocks, each with its own roundings (8-bit activations,
KV in bf16 or f16, llama.cpp's f16 GELU table and f16 attention). transformers' Gemma3 loaded
from the same GGUF (every block dequantized to float32, float32 activations throughout) is
neither: at a step where the two part, its top token says which of them left the math, and
its top-2 margin says whether the step was a near-tie that any rounding may decide.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

NEAR_TIE = 0.1      # the margin rule of the transformers tests (tests/models/test_gemma3_gguf.py)


@dataclass(frozen=True)
class Parting:
    """The first step where mimo's greedy token and llama-server's differ."""
    step: int
    mimo: int
    llama: int
    llama_margin: float         # llama-server's own top-2 logit margin there
    exact: int                  # float32 math's top token on the same history
    exact_margin: float         # and its top-2 margin
    llama_as_prompt: int        # llama-server's token for the same history sent as a prompt
    near_tie: float = NEAR_TIE  # the margin rule (bench agree's --margin)

    @property
    def verdict(self) -> str:
        """Who left the float32 math's pick: 'llama' (mimo kept it), 'mimo', 'both', or
        'near-tie' (the math's own margin is below the rule, any rounding may decide)."""
        if self.exact_margin < self.near_tie:
            return "near-tie"
        if self.mimo == self.exact:
            return "llama"
        return "mimo" if self.llama == self.exact else "both"

    def as_json(self) -> dict:
        return {**asdict(self), "llama_margin": round(self.llama_margin, 4),
                "exact_margin": round(self.exact_margin, 4), "verdict": self.verdict}


def first_parting(mine: list[int], theirs: list[int], upto: int) -> int | None:
    """The first step below `upto` where the two token lists differ, if any."""
    return next((k for k, (a, b) in enumerate(zip(mine[:upto], theirs[:upto])) if a != b), None)


class ExactReference:
    """transformers' Gemma3ForCausalLM from the GGUF, float32 (loaded at first use)."""

    def __init__(self, gguf: Path):
        self.gguf = Path(gguf)
        self._model: Any = None

    def top2(self, ids: list[int]) -> tuple[int, float]:
        """The top token after `ids` and its logit margin over the second."""
        import torch
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from transformers import AutoModelForCausalLM
            self._model = AutoModelForCausalLM.from_pretrained(
                str(self.gguf.parent), gguf_file=self.gguf.name, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = self._model(torch.tensor([ids])).logits[0, -1].double()
        top = logits.topk(2)
        return int(top.indices[0]), float(top.values[0] - top.values[1])
