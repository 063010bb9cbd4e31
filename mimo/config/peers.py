"""Which prefill workers a decode worker may take prompt KV from (`--prefill-peer URL`).

A decode worker POSTs the prompt to the URL a request's `x-mimo-prefill` header names and
places the bytes it gets back into its KV pools. Following any URL would let whoever can
reach the worker make it connect anywhere (a request forgery reaching hosts only the worker
can see). So a decode worker follows only:

- the URLs given with `--prefill-peer` (repeatable), compared by scheme, host, port and
  path, when any are given;
- else loopback URLs only (127.0.0.0/8, ::1, localhost): a single-machine setup works with
  no flag, and nothing beyond the machine is reachable through the header.

A URL it does not follow is the client's fault (HTTP 403), never a silent local run.
"""
from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from .base import ConfigError


def normalize_peer(url: str) -> str:
    """`scheme://host:port/path` of an http(s) URL (lower-case host, default port spelled
    out, no trailing slash); ValueError for anything else (credentials, query, fragment)."""
    try:
        u = urlsplit(url.strip())
        port = u.port
    except ValueError:
        raise ValueError(f"not a URL: {url!r}") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"a prefill worker's URL is http(s)://HOST[:PORT], not {url!r}")
    if u.username or u.password or u.query or u.fragment:
        raise ValueError(f"a prefill worker's URL has no credentials, query or fragment: "
                         f"{url!r}")
    host = u.hostname.lower()
    port = port or (443 if u.scheme == "https" else 80)
    shown = f"[{host}]" if ":" in host else host
    return f"{u.scheme}://{shown}:{port}{u.path.rstrip('/')}"


def check_peers(peers: tuple[str, ...]) -> tuple[str, ...]:
    """The normalized allow-list; ConfigError naming the first bad URL."""
    try:
        return tuple(normalize_peer(p) for p in peers)
    except ValueError as e:
        raise ConfigError(f"--prefill-peer: {e}") from None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def peer_allowed(url: str, peers: tuple[str, ...]) -> bool:
    """Whether a decode worker with allow-list `peers` (normalized; empty: loopback only)
    may take KV from `url`."""
    try:
        norm = normalize_peer(url)
    except ValueError:
        return False
    if peers:
        return norm in peers
    return _loopback(urlsplit(norm).hostname or "")
