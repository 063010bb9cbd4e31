"""fetch(): http(s) against a real loopback server, data: URLs, local files, refusals."""
from __future__ import annotations

import asyncio
import base64
import os

import httpx
import pytest
from helpers.media import loopback_server, self_signed_cert, send, stall

from mimo.multimodal.config import MediaConfig
from mimo.multimodal.errors import MediaError, MediaFetchError, MediaForbidden, MediaTooLarge
from mimo.multimodal.fetch import fetch

BODY = bytes(range(256)) * 100   # 25.6 kB


def run(coro):
    return asyncio.run(coro)


def loopback_cfg(**kw) -> MediaConfig:
    # The test server is on 127.0.0.1, which the default policy refuses.
    return MediaConfig(allow_private=True, **kw)


def routes():
    def big_nolength(h):
        # No Content-Length: the limit must be enforced while streaming.
        h.send_response(200)
        h.end_headers()
        for _ in range(64):
            h.wfile.write(b"x" * 4096)
    return {
        "/ok": lambda h: send(h, body=BODY),
        "/loop": lambda h: send(h, 302, headers={"Location": "/loop"}),
        "/hop1": lambda h: send(h, 301, headers={"Location": "/hop2"}),
        "/hop2": lambda h: send(h, 307, headers={"Location": "/ok"}),
        "/to-data": lambda h: send(h, 302, headers={"Location": "data:,hi"}),
        "/to-file": lambda h: send(h, 302, headers={"Location": "file:///etc/passwd"}),
        "/to-private": lambda h: send(h, 302, headers={
            "Location": "http://internal.example/secret"}),
        "/big": lambda h: send(h, body=b"y" * 100_000),
        "/big-nolength": big_nolength,
        "/slow": lambda h: stall(h, 3.0),
        "/missing": lambda h: send(h, 404, body=b"no"),
    }


def test_http_fetch_redirects_and_host_header():
    with loopback_server(routes()) as (base, seen):
        assert run(fetch(base + "/ok", loopback_cfg())) == BODY
        assert run(fetch(base + "/hop1", loopback_cfg())) == BODY
        assert [p for p, _ in seen[-3:]] == ["/hop1", "/hop2", "/ok"]

        # A name resolved by the injected resolver: we connect to the vetted address and
        # the server still sees the name in Host (virtual hosting keeps working).
        port = base.rsplit(":", 1)[1]

        async def resolver(host, p):
            assert host == "media.example"
            return ["127.0.0.1"]
        got = run(fetch(f"http://media.example:{port}/ok", loopback_cfg(), resolver=resolver))
        assert got == BODY
        assert seen[-1] == ("/ok", f"media.example:{port}")


def test_https_to_vetted_address_verifies_the_name(tmp_path):
    """We connect to the vetted IP, yet TLS still sends the name (SNI) and checks the
    certificate against the name: HTTPS works, and a certificate for another name fails."""
    import ssl
    cert, key = self_signed_cert(tmp_path, "media.example")
    trust = ssl.create_default_context(cafile=str(cert))

    async def resolver(host, p):
        return ["127.0.0.1"]
    with loopback_server({"/ok": lambda h: send(h, body=BODY)}, tls=(cert, key)) as (base, seen):
        port = base.rsplit(":", 1)[1]
        got = run(fetch(f"https://media.example:{port}/ok", loopback_cfg(), resolver=resolver,
                        transport=httpx.AsyncHTTPTransport(verify=trust)))
        assert got == BODY and seen[-1] == ("/ok", f"media.example:{port}")
        with pytest.raises(MediaFetchError, match="(?i)certificate|hostname"):
            run(fetch(f"https://other.example:{port}/ok", loopback_cfg(), resolver=resolver,
                      transport=httpx.AsyncHTTPTransport(verify=trust)))


def test_http_limits():
    with loopback_server(routes()) as (base, seen):
        with pytest.raises(MediaFetchError, match="more than 3 redirects"):
            run(fetch(base + "/loop", loopback_cfg(max_redirects=3)))
        assert sum(p == "/loop" for p, _ in seen) == 4
        with pytest.raises(MediaTooLarge, match="100000 bytes"):   # from Content-Length
            run(fetch(base + "/big", loopback_cfg(max_bytes=50_000)))
        with pytest.raises(MediaTooLarge, match="over the limit"):  # counted while streaming
            run(fetch(base + "/big-nolength", loopback_cfg(max_bytes=50_000)))
        with pytest.raises(MediaFetchError, match="HTTP 404"):
            run(fetch(base + "/missing", loopback_cfg()))
        with pytest.raises(MediaForbidden, match="unsupported scheme 'file'"):
            run(fetch(base + "/to-file", loopback_cfg(allowed_media_dirs=("/etc",))))
        with pytest.raises(MediaFetchError, match="invalid redirect"):
            run(fetch(base + "/to-data", loopback_cfg()))


def test_slow_server_times_out():
    with loopback_server(routes()) as (base, _):
        loop_time = asyncio.new_event_loop()
        try:
            t0 = loop_time.time()
            with pytest.raises(MediaFetchError, match="timed out"):
                loop_time.run_until_complete(
                    fetch(base + "/slow", loopback_cfg(read_timeout_s=0.3)))
            assert loop_time.time() - t0 < 2.5
            # The whole-fetch bound holds even when each read is within the read timeout.
            with pytest.raises(MediaFetchError, match="longer than 0.4s"):
                loop_time.run_until_complete(
                    fetch(base + "/slow", loopback_cfg(timeout_s=0.4, read_timeout_s=5)))
        finally:
            loop_time.close()


class _NoConnect(httpx.AsyncBaseTransport):
    """A transport that fails the test if anything tries to connect."""
    def __init__(self):
        self.calls = 0

    async def handle_async_request(self, request):
        self.calls += 1
        raise AssertionError(f"connected to {request.url} although it must be refused")


@pytest.mark.parametrize("addr", ["10.0.0.1", "169.254.169.254", "::1", "fd00:ec2::254",
                                  "127.0.0.1", "192.168.1.20", "::ffff:10.0.0.1", "0.0.0.0"])
def test_private_addresses_refused_before_connecting(addr):
    transport = _NoConnect()
    asked = []

    async def resolver(host, port):
        asked.append((host, port))
        return [addr]
    with pytest.raises(MediaForbidden, match="public hosts"):
        run(fetch("http://images.example/cat.png", MediaConfig(), resolver=resolver,
                  transport=transport))
    assert asked == [("images.example", 80)] and transport.calls == 0
    # Literal addresses in the URL are judged the same way, with no lookup.
    host = f"[{addr}]" if ":" in addr else addr
    with pytest.raises(MediaForbidden):
        run(fetch(f"https://{host}/x.png", MediaConfig(), resolver=resolver,
                  transport=transport))
    assert transport.calls == 0


def test_mixed_public_private_answer_refused():
    async def resolver(host, port):
        return ["93.184.216.34", "10.0.0.1"]   # a rebinding setup
    transport = _NoConnect()
    with pytest.raises(MediaForbidden, match="10.0.0.1"):
        run(fetch("http://a.example/", MediaConfig(), resolver=resolver, transport=transport))
    assert transport.calls == 0


def test_redirect_to_private_host_refused():
    with loopback_server(routes()) as (base, seen):
        port = base.rsplit(":", 1)[1]

        async def resolver(host, p):
            return {"cdn.example": ["127.0.0.1"], "internal.example": ["10.0.0.1"]}[host]
        # The first hop is allowed only because this test vets 127.0.0.1 as public: wrap
        # the policy so that loopback passes but 10/8 does not.
        import mimo.multimodal.address as address
        real = address.refusal
        try:
            address.refusal = lambda ip: None if ip.is_loopback else real(ip)
            with pytest.raises(MediaForbidden, match="10.0.0.1"):
                run(fetch(f"http://cdn.example:{port}/to-private", MediaConfig(),
                          resolver=resolver))
        finally:
            address.refusal = real
        assert [p for p, _ in seen] == ["/to-private"]


def test_unsupported_schemes():
    for url in ("ftp://example.com/a.png", "gopher://x/", "javascript:alert(1)", "x.png",
                "file://remote.example/etc/passwd"):
        with pytest.raises(MediaForbidden):
            run(fetch(url, MediaConfig(allowed_media_dirs=("/tmp",))))


def test_data_urls():
    payload = bytes(range(256))
    b64 = base64.b64encode(payload).decode()
    assert run(fetch(f"data:image/png;base64,{b64}", MediaConfig())) == payload
    wrapped = "\n".join(b64[i:i + 76] for i in range(0, len(b64), 76))
    assert run(fetch(f"data:image/png;base64,{wrapped}", MediaConfig())) == payload
    assert run(fetch("data:text/plain,a%20b%00%FF", MediaConfig())) == b"a b\x00\xff"
    assert run(fetch("data:,", MediaConfig())) == b""
    with pytest.raises(MediaTooLarge):
        run(fetch(f"data:image/png;base64,{b64}", MediaConfig(max_bytes=100)))
    with pytest.raises(MediaFetchError, match="base64"):
        run(fetch("data:image/png;base64,@@@@", MediaConfig()))
    with pytest.raises(MediaFetchError, match="no ','"):
        run(fetch("data:image/png;base64", MediaConfig()))


def test_local_files(tmp_path):
    root = tmp_path / "media"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.bin").write_bytes(b"inside")
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"outside")
    os.symlink(outside, root / "link.bin")          # a symlink pointing out
    os.symlink(root / "sub" / "a.bin", tmp_path / "in-link.bin")
    cfg = MediaConfig(allowed_media_dirs=(str(root),))

    assert run(fetch(str(root / "sub" / "a.bin"), cfg)) == b"inside"
    assert run(fetch(f"file://{root}/sub/a.bin", cfg)) == b"inside"
    assert run(fetch(f"file://localhost{root}/sub/%61.bin", cfg)) == b"inside"
    for bad in (str(outside), f"{root}/../secret.bin", f"{root}/sub/../../secret.bin",
                str(root / "link.bin"), f"file://{root}/link.bin", "/etc/passwd"):
        with pytest.raises(MediaForbidden, match="outside the allowed"):
            run(fetch(bad, cfg))
    # A link from outside into the allowed dir is judged by where it points.
    assert run(fetch(str(tmp_path / "in-link.bin"), cfg)) == b"inside"
    with pytest.raises(MediaFetchError, match="no such"):
        run(fetch(str(root / "nope.png"), cfg))
    with pytest.raises(MediaTooLarge):
        run(fetch(str(root / "sub" / "a.bin"), MediaConfig(allowed_media_dirs=(str(root),),
                                                           max_bytes=3)))
    with pytest.raises(MediaForbidden, match="disabled"):
        run(fetch(str(root / "sub" / "a.bin"), MediaConfig()))
    # A sibling whose name starts with the root's name is not inside it.
    (tmp_path / "media-evil").mkdir()
    (tmp_path / "media-evil" / "x").write_bytes(b"x")
    with pytest.raises(MediaForbidden):
        run(fetch(str(tmp_path / "media-evil" / "x"), cfg))


def test_all_errors_are_media_errors():
    for cls in (MediaFetchError, MediaForbidden, MediaTooLarge):
        assert issubclass(cls, MediaError) and issubclass(cls, ValueError)
