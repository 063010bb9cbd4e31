"""Typed readers of one request-body field: each returns the value or raises a 400 whose
`param` is the field and whose message says what was expected and what came. JSON's types
are checked as OpenAI documents them: a boolean is never a number, an integer field takes
no float, numbers must be finite."""
from __future__ import annotations

import math
from typing import Any

from .errors import bad_request

_MISSING = object()


def _kind(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


def number(body: dict, name: str, default=None, lo=None, hi=None, integer: bool = False,
           param: str | None = None):
    """`name` as a number (int or float) or, with `integer`, an integer, within [lo, hi]."""
    v = body.get(name)
    p = param or name
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise bad_request(f"'{p}' must be {'an integer' if integer else 'a number'}, "
                          f"got {_kind(v)}", p)
    if isinstance(v, float) and not math.isfinite(v):
        raise bad_request(f"'{p}' must be finite", p)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        want = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]"
        shown = v if not isinstance(v, int) or abs(v) < 10**30 else f"a {len(str(v))}-digit number"
        raise bad_request(f"'{p}' must be {want}, got {shown}", p)
    return v


def boolean(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_request(f"'{name}' must be a boolean, got {_kind(v)}", name)
    return v


def string(body: dict, name: str, default: str | None = None, *, where: str | None = None,
           param: str | None = None, nonempty: bool = False) -> str | None:
    """A string field (`where`: how the message names it, e.g. 'tools[0].function.name')."""
    v = body.get(name)
    w, p = where or name, param or name
    if v is None:
        return default
    if not isinstance(v, str):
        raise bad_request(f"'{w}' must be a string, got {_kind(v)}", p)
    if nonempty and not v:
        raise bad_request(f"'{w}' must not be empty", p)
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"'{w}' is not valid Unicode (lone surrogate escape)", p) from None
    return v


def obj(body: dict, name: str, *, where: str | None = None, param: str | None = None
        ) -> dict | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, dict):
        raise bad_request(f"'{where or name}' must be an object, got {_kind(v)}", param or name)
    return v


def array(body: dict, name: str, *, where: str | None = None, param: str | None = None,
          nonempty: bool = False) -> list | None:
    v = body.get(name)
    if v is None:
        return None
    w = where or name
    if not isinstance(v, list):
        raise bad_request(f"'{w}' must be an array, got {_kind(v)}", param or name)
    if nonempty and not v:
        raise bad_request(f"'{w}' must be a non-empty array", param or name)
    return v


def kind_of(v: Any) -> str:
    return _kind(v)


def check_keys(d: dict, param: str) -> None:
    """Object keys are strings from JSON, but may hold lone surrogates ("\\ud800")."""
    for k in d:
        try:
            k.encode("utf-8")
        except UnicodeEncodeError:
            raise bad_request(f"a key of '{param}' is not valid Unicode (lone surrogate "
                              f"escape)", param) from None


__all__ = ["array", "boolean", "check_keys", "kind_of", "number", "obj", "string"]
