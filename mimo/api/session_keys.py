"""What a worker reports about `prompt_cache_key` sessions, without a label per key.

A label per key would make a new time series for every session a client ever opens
(unbounded cardinality: a scrape grows without end, and Prometheus keeps every series it
saw). So the key itself is never exported: totals over all requests that sent one (their
count, prompt and cached tokens: the sessions' hit rate beside the whole server's), and a
gauge of the distinct keys seen in the last `window` seconds (how many sessions are live
now, which is what sizing the KV cache for them needs). The keys are held as 8-byte hashes,
at most `cap` of them (the least recently seen dropped first), so memory is bounded too.
"""
from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class SessionKeys:
    def __init__(self, window: float = 300.0, cap: int = 100_000, clock=time.monotonic):
        self.window, self.cap, self.clock = window, cap, clock
        self.requests = self.prompt_tokens = self.cached_tokens = 0
        self._seen: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    def observe(self, key: str, prompt_tokens: int, cached_tokens: int) -> None:
        h = hashlib.blake2b(key.encode(), digest_size=8).digest()
        with self._lock:
            self.requests += 1
            self.prompt_tokens += prompt_tokens
            self.cached_tokens += cached_tokens
            self._seen[h] = self.clock()
            self._seen.move_to_end(h)
            while len(self._seen) > self.cap:
                self._seen.popitem(last=False)

    def active(self) -> int:
        """Distinct keys seen in the last `window` seconds."""
        cut = self.clock() - self.window
        with self._lock:
            while self._seen and next(iter(self._seen.values())) < cut:
                self._seen.popitem(last=False)
            return len(self._seen)

    def collect(self):
        yield GaugeMetricFamily("mimo_prompt_cache_keys_active",
                                f"Distinct prompt_cache_key values seen in the last "
                                f"{self.window:g} s", value=self.active())
        for name, doc, v in (
                ("mimo_prompt_cache_key_requests", "Requests that sent a prompt_cache_key",
                 self.requests),
                ("mimo_prompt_cache_key_prompt_tokens", "Prompt tokens of requests that "
                 "sent a prompt_cache_key", self.prompt_tokens),
                ("mimo_prompt_cache_key_cached_tokens", "Of those, tokens served from the "
                 "prefix cache", self.cached_tokens)):
            yield CounterMetricFamily(name, doc, value=v)
