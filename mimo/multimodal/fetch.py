"""fetch(url, cfg) -> bytes: http(s), data: URLs, and local files under allowed directories.

Every way in is bounded: bytes (checked while streaming, not after), time (connect, read
silence, and the whole fetch), redirects (followed by hand so every hop's host is vetted
like the first), and reach (private and metadata addresses, schemes, directories).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, unquote_to_bytes, urlsplit

from .address import Resolver, check_host, parse_ip, system_resolver, vetted_address
from .config import MediaConfig
from .errors import MediaFetchError, MediaForbidden, MediaTooLarge

if TYPE_CHECKING:       # imported where a URL is fetched: most starts fetch none (~70 ms)
    import httpx

_DEFAULT_PORTS = {"http": 80, "https": 443}


async def fetch(url: str, cfg: MediaConfig, *, resolver: Resolver = system_resolver,
                transport: httpx.AsyncBaseTransport | None = None) -> bytes:
    """The bytes behind `url`. `resolver` and `transport` are injectable for tests (and
    for a caller with its own DNS or connection pool); any failure is a MediaError."""
    if not isinstance(url, str) or not url:
        raise MediaFetchError("media URL is empty")
    if url.startswith("/"):
        return await asyncio.to_thread(read_local, url, cfg)
    scheme = _split(url).scheme.lower()
    if scheme == "data":
        if len(url) > 2**20:   # decoding megabytes takes milliseconds: not on the loop
            return await asyncio.to_thread(decode_data_url, url, cfg.max_bytes)
        return decode_data_url(url, cfg.max_bytes)
    if scheme == "file":
        return await asyncio.to_thread(read_local, _file_url_path(url), cfg)
    if scheme in _DEFAULT_PORTS:
        try:
            # wait_for, not asyncio.timeout: the project supports Python 3.10.
            return await asyncio.wait_for(_fetch_http(url, cfg, resolver, transport),
                                          cfg.timeout_s)
        except asyncio.TimeoutError:
            raise MediaFetchError(f"fetching {_short(url)} took longer than "
                                  f"{cfg.timeout_s:g}s") from None
    raise MediaForbidden(f"unsupported URL scheme {scheme or '(none)'!r}: use http, https, "
                         "data, or file (when enabled)")


def _split(url: str):
    """urlsplit, a malformed URL (an unclosed IPv6 bracket, "http://[::1") a MediaError."""
    try:
        return urlsplit(url)
    except ValueError as e:
        raise MediaFetchError(f"malformed URL {_short(url)!r}: {e}") from None


# ---- data: URLs ---------------------------------------------------------------------------

def decode_data_url(url: str, max_bytes: int) -> bytes:
    """RFC 2397: data:[<mediatype>][;base64],<data>. The size is checked on the encoded
    text first, so an oversized URL is refused before it is decoded."""
    header, comma, payload = url[5:].partition(",")
    if not comma:
        raise MediaFetchError("malformed data: URL (no ',' before the data)")
    if header.lower().endswith(";base64"):
        payload = "".join(payload.split())   # line breaks are legal in base64 payloads
        if len(payload) // 4 * 3 > max_bytes + 2:
            raise MediaTooLarge(f"data: URL holds about {len(payload) // 4 * 3} bytes, "
                                f"over the limit of {max_bytes}")
        try:
            data = base64.b64decode(unquote(payload), validate=True)
        except (binascii.Error, ValueError) as e:
            raise MediaFetchError(f"data: URL is not valid base64: {e}") from e
    else:
        data = unquote_to_bytes(payload)
    if len(data) > max_bytes:
        raise MediaTooLarge(f"data: URL holds {len(data)} bytes, over the limit of {max_bytes}")
    return data


# ---- local files ----------------------------------------------------------------------------

def _file_url_path(url: str) -> str:
    parts = _split(url)
    if parts.netloc not in ("", "localhost"):
        raise MediaForbidden(f"file URL names a remote host {parts.netloc!r}")
    return unquote(parts.path)


def _allowed_root(real: str, cfg: MediaConfig) -> bool:
    for d in cfg.allowed_media_dirs:
        root = os.path.realpath(d)
        if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
            return True
    return False


def read_local(path: str, cfg: MediaConfig) -> bytes:
    """A local file's bytes, only when its real path (symlinks and '..' resolved) lies
    under one of `cfg.allowed_media_dirs`. Blocking: call it in a thread."""
    if not cfg.allowed_media_dirs:
        raise MediaForbidden("local media files are disabled (no allowed_media_dirs)")
    if not os.path.isabs(path):
        raise MediaForbidden(f"local media paths must be absolute, not {path!r}")
    real = os.path.realpath(path)
    if not _allowed_root(real, cfg):
        raise MediaForbidden(f"{path!r} is outside the allowed media directories")
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise MediaFetchError(f"no such media file {path!r}") from None
    except OSError as e:
        raise MediaFetchError(f"cannot open {path!r}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        # The path may have been swapped between realpath and open; judge what was opened.
        proc = f"/proc/self/fd/{fd}"
        if sys.platform == "linux" and os.path.exists(proc):
            if not _allowed_root(os.path.realpath(proc), cfg):
                raise MediaForbidden(f"{path!r} is outside the allowed media directories")
        if not Path(real).is_file():
            raise MediaFetchError(f"{path!r} is not a regular file")
        data = f.read(cfg.max_bytes + 1)
    if len(data) > cfg.max_bytes:
        raise MediaTooLarge(f"{path!r} is larger than the limit of {cfg.max_bytes} bytes")
    return data


# ---- http(s) --------------------------------------------------------------------------------

def _short(url: str) -> str:
    return url if len(url) <= 120 else url[:117] + "..."


async def _fetch_http(url: str, cfg: MediaConfig, resolver: Resolver,
                      transport: httpx.AsyncBaseTransport | None) -> bytes:
    import httpx
    timeout = httpx.Timeout(connect=cfg.connect_timeout_s, read=cfg.read_timeout_s,
                            write=cfg.read_timeout_s, pool=cfg.connect_timeout_s)
    # trust_env=False: an HTTP(S)_PROXY from the environment would connect on our behalf
    # to whatever the URL names, skipping the address check.
    async with httpx.AsyncClient(transport=transport, timeout=timeout, trust_env=False,
                                 follow_redirects=False) as client:
        for _ in range(cfg.max_redirects + 1):
            try:
                u = httpx.URL(url)      # ValueError too: "http://[not-an-ip]/"
                host = u.host           # decodes IDNA: ValueError for "xn--"
            except (httpx.InvalidURL, ValueError) as e:
                raise MediaFetchError(f"invalid URL {_short(url)!r}: {e}") from None
            if u.scheme not in _DEFAULT_PORTS:
                raise MediaForbidden(f"redirect to unsupported scheme {u.scheme!r}")
            port = u.port or _DEFAULT_PORTS[u.scheme]
            check_host(host, port, url)
            ip = await vetted_address(host, port, resolver, cfg.allow_private)
            # Connect to the vetted address; the name still goes in Host and in TLS SNI
            # (and certificate checks), so virtual hosts and HTTPS work as usual.
            target = u.copy_with(host=str(ip))
            ext = {}
            if u.scheme == "https" and parse_ip(host) is None:
                ext["sni_hostname"] = host
            req = client.build_request("GET", target, headers={"Host": u.netloc.decode(),
                                                                  "Accept-Encoding": "identity"},
                                       extensions=ext)
            try:
                resp = await client.send(req, stream=True)
            except httpx.TimeoutException as e:
                raise MediaFetchError(f"timed out fetching {_short(url)}") from e
            except httpx.InvalidURL as e:
                # httpx parses a redirect's Location even when not following it.
                raise MediaFetchError(f"{_short(url)} answered with an invalid redirect: "
                                      f"{e}") from e
            except httpx.HTTPError as e:
                raise MediaFetchError(f"cannot fetch {_short(url)}: {e}") from e
            try:
                if resp.is_redirect:
                    location = resp.headers.get("location")
                    if not location:
                        raise MediaFetchError(f"redirect without Location from {_short(url)}")
                    scheme = _split(location).scheme.lower()
                    if scheme and scheme not in _DEFAULT_PORTS:
                        # Never let a server steer us to data:, file: or anything else.
                        raise MediaForbidden(f"redirect to unsupported scheme {scheme!r}")
                    try:
                        url = str(u.join(location))
                    except (httpx.InvalidURL, ValueError):
                        raise MediaFetchError(f"bad redirect Location {location!r}") from None
                    continue
                return await _read_body(resp, url, cfg.max_bytes)
            finally:
                await resp.aclose()
    raise MediaFetchError(f"more than {cfg.max_redirects} redirects fetching media")


async def _read_body(resp: httpx.Response, url: str, max_bytes: int) -> bytes:
    import httpx
    if resp.status_code >= 400:
        raise MediaFetchError(f"HTTP {resp.status_code} fetching {_short(url)}")
    declared = resp.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise MediaTooLarge(f"{_short(url)} is {declared} bytes, over the limit of {max_bytes}")
    chunks, n = [], 0
    try:
        # Decoded bytes are counted, so a compressed body (sent despite Accept-Encoding:
        # identity) is bounded by what it expands to.
        async for chunk in resp.aiter_bytes():
            n += len(chunk)
            if n > max_bytes:   # a lying or absent Content-Length is caught here
                raise MediaTooLarge(f"{_short(url)} is over the limit of {max_bytes} bytes")
            chunks.append(chunk)
    except httpx.TimeoutException as e:
        raise MediaFetchError(f"timed out reading {_short(url)}") from e
    except httpx.HTTPError as e:
        raise MediaFetchError(f"error reading {_short(url)}: {e}") from e
    return b"".join(chunks)
