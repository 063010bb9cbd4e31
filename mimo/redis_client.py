"""Redis URLs to clients, shared by the worker's cache publisher, the router's state and the
L3 storage tier. A leaf: it imports nothing from mimo, so any package may use it (the
dependency rule in docs/architecture.md)."""
from __future__ import annotations

from urllib.parse import unquote


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], str | None, str | None]:
    """(startup nodes, username, password) of redis-cluster://[[USER]:PASS@]H:P[,H:P...]."""
    prefix = "redis-cluster://"
    if not url.startswith(prefix):
        raise ValueError(f"not a Redis Cluster URL: {url!r}")
    rest = url[len(prefix):].split("/", 1)[0]
    user = password = None
    if "@" in rest:
        cred, rest = rest.rsplit("@", 1)
        user, _, password = cred.rpartition(":") if ":" in cred else ("", "", cred)
        user, password = unquote(user) or None, unquote(password) or None
    nodes = []
    for hp in rest.split(","):
        host, sep, port = hp.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"{url!r}: {hp!r} is not HOST:PORT "
                             "(redis-cluster://HOST:PORT[,HOST:PORT...])")
        nodes.append((host, int(port)))
    return nodes, user, password


def open_redis(url: str):
    """redis.asyncio client for redis://... or a cluster client for redis-cluster://H:P,..."""
    if url.startswith("redis-cluster://"):
        from redis.asyncio.cluster import ClusterNode, RedisCluster
        nodes, user, password = parse_cluster_url(url)
        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in nodes],
                            username=user, password=password, socket_timeout=1.0,
                            socket_connect_timeout=1.0)
    import redis.asyncio as aredis
    return aredis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
