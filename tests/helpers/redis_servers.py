"""The tests' real Redis servers: the benchmarks' launcher (mimo/bench/redis_process.py)."""
from mimo.bench.redis_process import RedisCluster3, RedisServer, free_port

__all__ = ["RedisCluster3", "RedisServer", "free_port"]
