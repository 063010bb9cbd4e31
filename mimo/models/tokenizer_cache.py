"""A GGUF tokenizer, built once per file's tokenizer and kept as `tokenizer.json`.

Rebuilding the `tokenizers` pipeline from a GGUF's metadata derives every merge of a 262k
vocabulary in Python (over a second of each start); reading the built pipeline back is a
fraction of that. Entries live under `$MIMO_CACHE_DIR/tokenizers` (default
`~/.cache/mimo`), keyed by the tokenizer metadata, the builder's source and the `tokenizers`
version, so any change to one of them is a new entry. `MIMO_TOKENIZER_CACHE=off` disables
it. An entry that cannot be read is rebuilt; one that cannot be written is skipped.
A GGUF file's long arrays (`GGUFArray`) enter the key as the bytes it stores, undecoded; the
same metadata as Python lists (another reader's) is another entry.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers
from tokenizers import Tokenizer as _Backend

from .gguf_file import GGUFArray

log = logging.getLogger(__name__)
_BUILDER = Path(__file__).with_name("tokenizer.py")


def cache_root() -> Path:
    base = os.environ.get("MIMO_CACHE_DIR") or Path.home() / ".cache" / "mimo"
    return Path(base) / "tokenizers"


def metadata_key(md: Mapping[str, Any]) -> str:
    """Digest of everything a GGUF tokenizer is built from."""
    h = hashlib.sha256()
    h.update(_BUILDER.read_bytes())
    h.update(tokenizers.__version__.encode())
    for key in sorted(k for k in md if k.startswith("tokenizer.") or k == "general.architecture"):
        value = md[key]
        h.update(b"\x01" + key.encode() + b"\x02")
        if isinstance(value, GGUFArray):          # as stored: nothing decoded
            h.update(b"\x05" + value.stored())
        elif isinstance(value, (list, tuple)):
            h.update(f"{len(value)}\x03".encode())
            h.update(_array_bytes(value))
        else:
            h.update(repr(value).encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:32]


def _array_bytes(value: list | tuple) -> bytes:
    """A metadata array's bytes for the key: strings joined, numbers as one numpy buffer
    with its dtype (str() of 262k scores took ~0.1 s of every start), anything else by str."""
    if set(map(type, value)) == {str}:
        return "\x00".join(value).encode("utf-8", "surrogatepass")
    try:
        arr = np.asarray(value)
    except ValueError:                   # ragged nested arrays
        arr = None
    if arr is not None and arr.dtype.kind in "biuf":
        return arr.dtype.str.encode() + b"\x04" + arr.tobytes()
    return "\x00".join(map(str, value)).encode("utf-8", "surrogatepass")


def cached_backend(md: Mapping[str, Any], build: Callable[[], _Backend]) -> _Backend:
    if os.environ.get("MIMO_TOKENIZER_CACHE", "on") == "off":
        return build()
    path = cache_root() / f"{metadata_key(md)}.json"
    if path.is_file():
        try:
            return _Backend.from_file(str(path))
        except Exception as e:       # a truncated or foreign file: rebuild and replace it
            log.warning("tokenizer cache entry %s unreadable (%s); rebuilding", path, e)
    tok = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        tok.save(tmp)
        os.replace(tmp, path)        # whole or absent: readers never see a partial entry
    except OSError as e:
        log.info("tokenizer cache not written (%s)", e)
    return tok
