"""Which network addresses a media URL may reach (SSRF defence), and host resolution.

A URL's host is resolved once, every address is vetted, and the fetch then connects to a
vetted address itself; resolving again at connect time would let a DNS answer that
changes between the two lookups (DNS rebinding) slip a private address through.
"""
from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable

from .errors import MediaFetchError, MediaForbidden

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# resolver(host, port) -> the host's addresses, as strings
Resolver = Callable[[str, int], Awaitable[list[str]]]

# Cloud metadata services. 169.254.169.254 is link-local and already refused; the AWS IPv6
# one (fd00:ec2::254) is in the unique-local range; both are named so the message is plain.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "fd00:ec2::254", "169.254.170.2", "100.100.100.200"))


def refusal(addr: IPAddress) -> str | None:
    """Why a connection to `addr` is refused, or None when it is a public address."""
    if isinstance(addr, ipaddress.IPv6Address):
        # ::ffff:10.0.0.1 and 64:ff9b::/96 carry an IPv4 address: judge that one.
        mapped = addr.ipv4_mapped or (addr.sixtofour if addr.sixtofour else None)
        if mapped is not None:
            return refusal(mapped)
        if addr in ipaddress.ip_network("64:ff9b::/96"):
            return refusal(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
    if addr in METADATA_ADDRESSES:
        return "a cloud metadata address"
    for kind in ("loopback", "private", "link_local", "multicast", "reserved",
                 "unspecified"):
        if getattr(addr, f"is_{kind}"):
            return f"a {kind.replace('_', '-')} address"
    if isinstance(addr, ipaddress.IPv4Address) and addr in _CGNAT:
        return "a shared (carrier-grade NAT) address"
    if not addr.is_global:
        return "not a globally routable address"
    return None


_CGNAT = ipaddress.ip_network("100.64.0.0/10")


def parse_ip(host: str) -> IPAddress | None:
    """`host` as an IP address when it is a literal one (brackets and zone id allowed)."""
    h = host.strip("[]").split("%", 1)[0]
    try:
        return ipaddress.ip_address(h)
    except ValueError:
        return None


# DNS labels as hosts name them (underscores too: some hosts have them), after IDNA.
_NAME = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


def check_host(host: str, port: int, url: str) -> None:
    """A URL's host and port as a connection can use them, else a MediaFetchError: a host
    that is an IP literal, or a name that encodes to DNS labels (IDNA: no empty label, none
    over 63 bytes, valid punycode), and a port in 1..65535."""
    shown = url if len(url) <= 120 else url[:117] + "..."
    if not host:
        raise MediaFetchError(f"URL {shown!r} has no host")
    if not 0 < port < 65536:
        raise MediaFetchError(f"URL {shown!r} has port {port}, outside 1..65535")
    if parse_ip(host) is not None:
        return
    try:
        name = host.rstrip(".").encode("idna").decode("ascii")
    except UnicodeError as e:
        raise MediaFetchError(f"URL {shown!r} has a malformed host {host[:64]!r}: {e}") from None
    if not _NAME.match(name):
        raise MediaFetchError(f"URL {shown!r} has a malformed host {host[:64]!r}: a host name "
                              f"is letters, digits, '-' and '_' between dots")


async def system_resolver(host: str, port: int) -> list[str]:
    """The OS resolver, off the event loop (getaddrinfo blocks; asyncio runs it in a
    thread)."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise MediaFetchError(f"cannot resolve host {host!r}: {e.strerror}") from e
    except UnicodeError as e:   # a name no DNS label encodes ("a..b", a 64-byte label)
        raise MediaFetchError(f"cannot resolve host {host[:64]!r}: {e}") from None
    # info[4] is (host, port[, flow, scope]) for the inet families SOCK_STREAM resolves;
    # typeshed also allows other families' int host, hence the str().
    return [str(info[4][0]) for info in infos]


async def vetted_address(host: str, port: int, resolver: Resolver,
                         allow_private: bool) -> IPAddress:
    """Resolve `host` and return the address to connect to. Refuses (MediaForbidden) when
    *any* of its addresses is not public: a name that maps to both a public and a private
    address is a rebinding setup, not a mistake to route around."""
    literal = parse_ip(host)
    if literal is not None:
        addrs = [literal]
    else:
        names = await resolver(host, port)
        addrs = []
        for a in names:
            ip = parse_ip(a)
            if ip is None:
                raise MediaFetchError(f"resolver returned a non-address {a!r} for {host!r}")
            addrs.append(ip)
        if not addrs:
            raise MediaFetchError(f"host {host!r} has no address")
    if not allow_private:
        for ip in addrs:
            why = refusal(ip)
            if why is not None:
                raise MediaForbidden(f"host {host!r} resolves to {ip}, {why}; media URLs "
                                     "must point to public hosts")
    return addrs[0]
