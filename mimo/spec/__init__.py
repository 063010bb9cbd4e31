"""Speculative decoding: drafters propose, the target verifies all drafts in one forward.

`make_drafter(spec_config, model_config)` picks the drafter a `SpecConfig` names."""
from __future__ import annotations

from ..config import ConfigError, ModelConfig, SpecConfig
from .drafter import Drafter
from .mtp import MTPDrafter
from .ngram import NgramDrafter
from .stats import SpecStats

__all__ = ["Drafter", "MTPDrafter", "NgramDrafter", "SpecStats", "make_drafter"]


def make_drafter(cfg: SpecConfig, model_config: ModelConfig, model=None, runner=None) -> Drafter:
    """`model` and `runner` (the engine's ModelRunner: pools, window, attention backend) are
    needed by the MTP drafter only."""
    if cfg.speculative == "ngram":
        return NgramDrafter(cfg.ngram_max, cfg.ngram_min)
    if cfg.speculative == "mtp":
        if not getattr(model_config, "num_mtp_layers", 0):
            raise ConfigError(
                f"--speculative mtp needs a model with MTP (multi-token prediction) layers; "
                f"this {model_config.arch} model has none (use --speculative ngram)")
        if model is None or runner is None:
            raise ConfigError("the MTP drafter needs the engine's model and runner")
        return MTPDrafter(model, runner)
    raise ConfigError(f"unknown drafter {cfg.speculative!r}")
