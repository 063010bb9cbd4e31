"""Malformed media URLs are MediaErrors (a 400 at the API), never another exception (a 500
once: "http://[::1", an unclosed IPv6 bracket, raised urllib's ValueError). No URL here
reaches a resolver or a socket: each is refused while it is parsed."""
from __future__ import annotations

import asyncio

import pytest

from mimo.multimodal.address import system_resolver
from mimo.multimodal.config import MediaConfig
from mimo.multimodal.errors import MediaError, MediaFetchError
from mimo.multimodal.fetch import fetch

MALFORMED = [
    "http://[::1", "HTTPS://[::1", "http://[::1]]/x", "http://[not-an-ip]/x",
    "http://[::ffff:300.0.0.1]/", "http://[v1.x]/", "file://[::1/x",
    "http://[::1]:99999/x", "http://127.0.0.1:-1/", "http://example.com:abc/x",
    "http://:80/x", "http:///x", "http://@/x", "http:x",
    "http://a b.com/x", "http://%zz/x", "http://a..b/x", "http://" + "a" * 64 + ".com/x",
    "http://xn--/x", "http://xn--zz-\u00e9/x", "http://exa\x00mple.com/", "http://\u2000/",
]


async def _no_resolving(host: str, port: int) -> list[str]:
    raise AssertionError(f"a malformed URL reached the resolver with host {host!r}")


@pytest.mark.parametrize("url", MALFORMED)
def test_a_malformed_url_is_a_media_error(url):
    with pytest.raises(MediaError):
        asyncio.run(fetch(url, MediaConfig(), resolver=_no_resolving))


@pytest.mark.parametrize("host", ["a..b", "b" * 64 + ".com", ".."])
def test_the_system_resolver_refuses_names_no_dns_label_encodes(host):
    # IDNA encoding fails before any lookup leaves the machine.
    with pytest.raises(MediaFetchError):
        asyncio.run(system_resolver(host, 80))
