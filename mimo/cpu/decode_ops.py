"""The fused decode-layer ops (csrc/decode_ops.cpp): a second Python module inside the same
shared object as the kernels (`extension.load()`), whose products it calls in C++.

`load(isa)` returns the module (its `DecodeLayer` class and the elementwise ops it is made
of), or None where the kernels are not loaded; callers then keep the plain PyTorch layer.
"""
from __future__ import annotations

import threading
from pathlib import Path
from types import ModuleType

from . import extension

SUFFIX = "_decode_ops"     # PYBIND11_MODULE's name in decode_ops.cpp: the build's + this
_lock = threading.Lock()
_mods: dict[str, ModuleType] = {}   # by the kernels' shared object


def load(isa: str | None = None) -> ModuleType | None:
    """The decode ops of the build `extension.load(isa)` gives (None when there is none)."""
    ext = extension.load(isa)
    if ext is None or ext.__file__ is None:
        return None
    with _lock:
        mod = _mods.get(ext.__file__)
        if mod is None:
            name = ext.__name__ + SUFFIX
            mod = _mods[ext.__file__] = extension._import(name, Path(ext.__file__))
        return mod
