"""Config errors, strict construction from dicts, sizes like '80GiB'."""
from __future__ import annotations

import dataclasses
import re
from typing import Any


class ConfigError(ValueError):
    """An option has an invalid value or an unknown name."""


def _from_dict(cls, data: dict[str, Any]):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} option(s): {', '.join(unknown)}")
    return cls(**data)


_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
          "t": 1e12, "tb": 1e12, "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20,
          "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40}


def parse_size(text: str | int) -> int:
    """'80GiB' -> bytes. Plain integers are bytes."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m or (m.group(2) or "").lower() not in _UNITS:
        raise ConfigError(f"cannot parse size {text!r} (examples: 512MiB, 80GiB, 2TiB)")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
