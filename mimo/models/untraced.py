"""`untraced`: `torch.compiler.disable`, applied only once something is compiled.

`torch.compiler.disable` imports `torch._dynamo` where it decorates, which cost every start
about 1.7 s, while layers are compiled only on request (`--compile on`; auto is off on
CPU). A function marked `@untraced` runs as it is; `arm()`, called before the first
`torch.compile`, swaps in its disabled version, so a compiled layer breaks its graph there.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_cells: list[list[Callable[..., Any]]] = []
_armed = False


def untraced(fn: F) -> F:
    cell: list[Callable[..., Any]] = [fn]
    _cells.append(cell)
    if _armed:
        arm()

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return cell[0](*args, **kwargs)
    return call  # type: ignore[return-value]


def arm() -> None:
    """Mark every `@untraced` function as excluded from tracing (imports torch._dynamo)."""
    global _armed
    import torch
    _armed = True
    for cell in _cells:
        if not getattr(cell[0], "_mimo_untraced", False):
            disabled = torch.compiler.disable(cell[0])
            disabled._mimo_untraced = True
            cell[0] = disabled
