"""Typed media errors. Every one is a client fault (bad URL, bad bytes, too big), so the
server maps the whole family to HTTP 400 and a stage turns them into `InvalidRequest`.

They keep a single message argument so they survive pickling across the decode process
pool unchanged (an exception with a custom __init__ signature does not unpickle).
"""
from __future__ import annotations


class MediaError(ValueError):
    """Base class: the media item cannot be used. The message says why, for the client."""


class MediaFetchError(MediaError):
    """The bytes could not be fetched: unreachable host, HTTP error, timeout, bad URL."""


class MediaTooLarge(MediaError):
    """Over a configured bound: download bytes, image pixels, decoded video bytes."""


class MediaForbidden(MediaError):
    """Not allowed by policy: private or metadata address, scheme, path outside the
    allowed directories."""


class MediaDecodeError(MediaError):
    """The bytes are not a decodable image or video (corrupt, truncated, unsupported)."""


class EncoderUnavailable(RuntimeError):
    """No remote encoder worker could encode the media (all down or refusing): a server
    fault, HTTP 503, never a client one."""
