"""The engine's face: all that code outside engine/ sees of a running engine (the
dependency rule in docs/architecture.md)."""
from __future__ import annotations

from .sequence import TokenLogprob

__all__ = ["TokenLogprob"]
