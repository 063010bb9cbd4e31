"""The Redis names the workers' cache publisher writes and the router reads: one place for
both sides of the wire (docs/router.md).

Every router key shares the hash tag {mimo:rt} (one Redis Cluster slot: heartbeats,
membership, in-flight counts, read together); each worker incarnation's page sets share
their own tag, so the bulky part spreads over a cluster. The page sets' kinds are the
tiers' key kinds (`kvcache.tiers.keys`: FULL, SWA) and, for a worker's host tier, L2_FULL
and L2_SWA below.

A leaf: it imports nothing of mimo, so the worker side (`engine/cache_publisher.py`) may
import it without importing the router.
"""
from __future__ import annotations

import hashlib
from urllib.parse import urlsplit

L2_FULL, L2_SWA = "hf", "hs"        # a worker's host-tier page sets (kinds of pages_key)

PREFIX = "{mimo:rt}"
WORKERS = PREFIX + ":workers"                 # set: worker URLs in the routing set
ROUTERS = PREFIX + ":routers"                 # zset: router id -> last seen (ms)


def heartbeat_key(url: str) -> str:
    return f"{PREFIX}:hb:{url}"


def incarnation_key(url: str) -> str:
    """The worker's last incarnation (no TTL): a restart deletes that one's page sets."""
    return f"{PREFIX}:inc:{url}"


def inflight_key(router_id: str) -> str:
    return f"{PREFIX}:fl:{router_id}"


def pages_key(incarnation: str, kind: str) -> str:
    return f"{{mimo:pk:{incarnation}}}:{kind}"


def l3_key(store: str, kind: str) -> str:
    """The pages one shared store holds (`store`: `storage_id`), every worker's writes."""
    return f"{{mimo:l3:{store}}}:{kind}"


def storage_id(fingerprint: bytes, url: str) -> str:
    """Names one shared store of one model's KV: workers that read the same store with the
    same keys give the same id (credentials are not part of it)."""
    parts = urlsplit(url)
    where = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
    return hashlib.blake2b(fingerprint + where.encode(), digest_size=8).hexdigest()


def pending_key(incarnation: str, kind: str) -> str:
    """Routers' zset of pages that requests in flight to the worker will leave cached
    (score: expiry, ms): a request arriving meanwhile is credited with them."""
    return f"{{mimo:pk:{incarnation}}}:p{kind}"
