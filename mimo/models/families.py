"""The model families mimo serves, each declared by its own module's `ARCHITECTURE`. Adding a
family is a module with an `Architecture` and its name here."""
from __future__ import annotations

import functools
import importlib

from .architecture import Architecture

MODULES = ("gemma3", "llama", "mimo_v2_flash", "qwen2_5_vl")


@functools.cache
def architectures() -> dict[str, Architecture]:
    """ModelConfig.arch -> its Architecture. Imported on first use: the family modules pull
    in torch and the model code, which config-only callers need not pay for at import."""
    out = {}
    for m in MODULES:
        a: Architecture = importlib.import_module(f"{__package__}.{m}").ARCHITECTURE
        out[a.name] = a
    return out


def by_name(arch: str) -> Architecture | None:
    return architectures().get(arch)


def by_model_type(model_type: str) -> Architecture | None:
    return next((a for a in architectures().values() if model_type in a.model_types), None)


def model_types() -> list[str]:
    return sorted(t for a in architectures().values() for t in a.model_types)


def gguf_formats() -> dict[str, Architecture]:
    """GGUF `general.architecture` -> the family that reads it."""
    return {a.name: a for a in architectures().values() if a.gguf is not None}
