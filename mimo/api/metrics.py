"""Prometheus metrics of one server (own registry, so tests can run several servers)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

_LAT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("mimo_requests", "Finished requests", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("mimo_prompt_tokens", "Prompt tokens", registry=r)
        self.generation_tokens = Counter("mimo_generation_tokens", "Generated tokens", registry=r)
        self.cached_tokens = Counter("mimo_cached_prompt_tokens", "Prompt tokens served from the prefix cache", registry=r)
        self.ttft = Histogram("mimo_time_to_first_token_seconds", "Time to first token", buckets=_LAT, registry=r)
        self.itl = Histogram("mimo_inter_token_latency_seconds", "Time between streamed tokens", buckets=_LAT, registry=r)
        self.e2e = Histogram("mimo_request_latency_seconds", "Request latency", buckets=_LAT, registry=r)
        self.queue = Gauge("mimo_queue_length", "Requests waiting for admission", registry=r)
        self.running = Gauge("mimo_running_requests", "Requests running in the engine", registry=r)
        self.pool = Gauge("mimo_kv_pool_pages", "KV pool pages by state", ["pool", "state"], registry=r)
        self.steps = Gauge("mimo_engine_steps", "Engine iterations run so far", registry=r)
        self.queue_wait = Histogram("mimo_queue_wait_seconds", "Time from arrival to admission",
                                    buckets=_LAT, registry=r)
        self.queue_wait_max = Gauge("mimo_queue_wait_max_seconds",
                                    "Longest time any request waited for admission", registry=r)
        self._max_wait = 0.0

    def watch_encoder(self, encode) -> None:
        """Export the encode stage's forward count and the embedding cache's hits and
        misses, read at scrape time (they are counted where they happen, off the loop)."""
        self.registry.register(_EncoderCollector(encode))

    def observe_queue_wait(self, seconds: float) -> None:
        self.queue_wait.observe(seconds)
        if seconds > self._max_wait:
            self._max_wait = seconds
            self.queue_wait_max.set(seconds)

    def observe_engine(self, engine, steps: int = 0) -> None:
        """Sample the engine's queue and pools (a racy read of counters: fine for gauges)."""
        self.steps.set(steps)
        self.queue.set(len(engine.scheduler.waiting))
        self.running.set(len(engine.scheduler.running))
        for name, st in engine.pool.stats().items():
            for state in ("capacity", "free", "evictable", "in_use"):
                self.pool.labels(name, state).set(st[state])

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EncoderCollector:
    def __init__(self, encode):
        self.encode = encode

    def collect(self):
        enc = self.encode
        for name, doc, value in (
                ("mimo_embed_cache_hits", "Media items whose embeddings came from the cache", enc.cache_hits),
                ("mimo_embed_cache_misses", "Media items not in the embedding cache", enc.cache_misses),
                ("mimo_encoder_forwards", "Vision-encoder forward passes run", self.encode.forwards)):
            yield CounterMetricFamily(name, doc, value=value)
