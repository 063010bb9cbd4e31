"""Speculative decoding: drafters propose, the target verifies all drafts in one forward.

`make_drafter(spec_config, model_config)` picks the drafter a `SpecConfig` names."""
from __future__ import annotations

from ..config import ConfigError, ModelConfig, SpecConfig
from .drafter import Drafter
from .ngram import NgramDrafter
from .stats import SpecStats

__all__ = ["Drafter", "NgramDrafter", "SpecStats", "make_drafter"]


def make_drafter(cfg: SpecConfig, model_config: ModelConfig, model=None) -> Drafter:
    if cfg.speculative == "ngram":
        return NgramDrafter(cfg.ngram_max, cfg.ngram_min)
    if cfg.speculative == "mtp":
        if not getattr(model_config, "num_mtp_layers", 0):
            raise ConfigError(
                f"--speculative mtp needs a model with MTP (multi-token prediction) layers; "
                f"this {model_config.arch} model has none (use --speculative ngram)")
        raise ConfigError("--speculative mtp: the MTP drafter is not built yet")
    raise ConfigError(f"unknown drafter {cfg.speculative!r}")
