"""Prometheus metrics of one server (own registry, so tests can run several servers).

Speculative decoding (present whatever the flag; zero while it is off):
  mimo_spec_verify_steps_total            verify steps (one per decoding request and step)
  mimo_spec_emitted_tokens_total          tokens those steps emitted (accepted drafts + 1 each)
  mimo_spec_draft_tokens_total{position}  draft tokens proposed at draft position 0, 1, ...
  mimo_spec_accepted_tokens_total{position}  of those, accepted by the target
  mimo_spec_mean_acceptance_length        emitted / verify steps since start (1.0 = no gain)
The acceptance rate at position i is accepted{position="i"} / draft{position="i"}.

Engine:
  mimo_preemptions_total                  running requests preempted (they resume later)
  mimo_failed_steps_total                 engine steps that raised (each failed only its requests)
  mimo_requests_aborted_total{endpoint}   requests whose client went away first (status 499)

Sessions (prompt_cache_key; no label per key: session_keys.py says why):
  mimo_prompt_cache_keys_active           distinct keys seen in the last 300 s
  mimo_prompt_cache_key_requests_total    requests that sent one
  mimo_prompt_cache_key_prompt_tokens_total / _cached_tokens_total   their prompt tokens,
      and those served from the prefix cache (the sessions' hit rate)

Prefix cache (when it is on):
  mimo_prefix_cache_window_cut_tokens_total{cause}  prompt tokens equal to a cached prefix
      but not reused, the SWA window before them missing: cause="never_kept" (retention
      kept no checkpoint there) or "evicted" (SWA pressure freed it: a larger SWA share helps)
  mimo_prefix_cache_freed_pages_total{pool,how}     pages eviction freed (how="node": whole
      nodes; "swa_only": SWA pages alone, their full KV kept)
  mimo_prefix_cache_revived_swa_pages_total         tombstoned SWA pages filled again
  mimo_prefix_cache_rebuilt_tokens_total            prompt tokens reused past a missing
      window by a window rebuild (recomputing only the SWA receptive field before the end)
  mimo_prefix_cache_partial_tokens_total            prompt tokens reused from the first rows
      of a cached page after the whole pages (a partial last page), copied at admission
  mimo_prefix_cache_paused_sessions_total           answers that ended in a tool call, their
      KV then held after everything else for --tool-pause-hold seconds

Remote encoders (with --encoder-worker):
  mimo_encoder_retries_total              calls that failed on an encoder and moved on
  mimo_encoder_request_bytes_total        bytes sent to encoders (probes, misses' patches)
  mimo_encoder_workers_down               encoders out of the ring now
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..engine.face import EngineStats, SpecTotals
from .session_keys import SessionKeys
from .tier_metrics import TierCollector

_LAT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("mimo_requests", "Finished requests", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("mimo_prompt_tokens", "Prompt tokens", registry=r)
        self.generation_tokens = Counter("mimo_generation_tokens", "Generated tokens", registry=r)
        self.cached_tokens = Counter("mimo_cached_prompt_tokens",
                                     "Prompt tokens served from the prefix cache", registry=r)
        self.ttft = Histogram("mimo_time_to_first_token_seconds", "Time to first token",
                              buckets=_LAT, registry=r)
        self.itl = Histogram("mimo_inter_token_latency_seconds", "Time between streamed tokens",
                             buckets=_LAT, registry=r)
        self.e2e = Histogram("mimo_request_latency_seconds", "Request latency", buckets=_LAT, registry=r)
        self.queue = Gauge("mimo_queue_length", "Requests waiting for admission", registry=r)
        self.running = Gauge("mimo_running_requests", "Requests running in the engine", registry=r)
        self.pool = Gauge("mimo_kv_pool_pages", "KV pool pages by state", ["pool", "state"], registry=r)
        self.steps = Gauge("mimo_engine_steps", "Engine iterations run so far", registry=r)
        self.spec_steps = Counter("mimo_spec_verify_steps", "Speculative verify steps", registry=r)
        self.spec_emitted = Counter("mimo_spec_emitted_tokens",
                                    "Tokens emitted by speculative verify steps", registry=r)
        self.spec_drafted = Counter("mimo_spec_draft_tokens", "Draft tokens proposed, by position",
                                    ["position"], registry=r)
        self.spec_accepted = Counter("mimo_spec_accepted_tokens",
                                     "Draft tokens accepted, by position", ["position"], registry=r)
        self.spec_mal = Gauge("mimo_spec_mean_acceptance_length",
                              "Tokens per speculative verify step since start", registry=r)
        # engine totals at the last observation (counters take deltas)
        self._spec_seen: tuple[int, int, list[int], list[int]] | None = None
        self.queue_wait = Histogram("mimo_queue_wait_seconds", "Time from arrival to admission",
                                    buckets=_LAT, registry=r)
        self.queue_wait_max = Gauge("mimo_queue_wait_max_seconds",
                                    "Longest time any request waited for admission", registry=r)
        self._max_wait = 0.0
        self.sessions = SessionKeys()
        r.register(self.sessions)
        self.aborted = Counter("mimo_requests_aborted", "Requests whose client went away "
                               "before the answer was complete (their KV freed at once)",
                               ["endpoint"], registry=r)

    def watch_encoder(self, encode) -> None:
        """Export the encode stage's forward count and the embedding cache's hits and
        misses, read at scrape time (they are counted where they happen, off the loop)."""
        self.registry.register(_EncoderCollector(encode))

    def watch_engine(self, stats: Callable[[], EngineStats]) -> None:
        """Export the engine's running totals from its snapshot (`AsyncEngine.stats`), read
        at scrape time: preemptions, failed steps, the prefix cache's counters, the tiers'
        (kvcache/tiers/) and the CPU and kernels in use."""
        self.registry.register(_EngineCollector(stats))
        self.registry.register(TierCollector(stats))

    def observe_queue_wait(self, seconds: float) -> None:
        self.queue_wait.observe(seconds)
        if seconds > self._max_wait:
            self._max_wait = seconds
            self.queue_wait_max.set(seconds)

    def observe_engine(self, st: EngineStats) -> None:
        """Set the gauges from the engine's latest snapshot."""
        self.steps.set(st.steps)
        self.queue.set(st.waiting)
        self.running.set(st.running)
        for name, pool in st.pools.items():
            for state in ("capacity", "free", "evictable", "in_use"):
                self.pool.labels(name, state).set(pool[state])
        if st.spec is not None:
            self._observe_spec(st.spec)

    def _observe_spec(self, t: SpecTotals) -> None:
        """Counters advance by what the engine's running totals gained since last time."""
        seen = self._spec_seen or (0, 0, [], [])
        drafted, accepted = list(t.drafted), list(t.accepted)
        self.spec_steps.inc(max(0, t.steps - seen[0]))
        self.spec_emitted.inc(max(0, t.emitted - seen[1]))
        for i in range(min(len(drafted), len(accepted))):
            old_d = seen[2][i] if i < len(seen[2]) else 0
            old_a = seen[3][i] if i < len(seen[3]) else 0
            self.spec_drafted.labels(str(i)).inc(max(0, drafted[i] - old_d))
            self.spec_accepted.labels(str(i)).inc(max(0, accepted[i] - old_a))
        self._spec_seen = (t.steps, t.emitted, drafted, accepted)
        self.spec_mal.set(t.mean_acceptance_length)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    def __init__(self, stats: Callable[[], EngineStats]):
        self.stats = stats

    def collect(self):
        st = self.stats()
        yield CounterMetricFamily("mimo_preemptions", "Running requests preempted to free KV "
                                  "pages (they resume later)", value=st.preemptions)
        yield CounterMetricFamily("mimo_failed_steps", "Engine steps that raised; each failed "
                                  "only the requests it touched", value=st.failed_steps)
        info = GaugeMetricFamily("mimo_compute_info", "The CPU's instruction sets and the "
                                 "kernels in use (value 1)",
                                 labels=["cpu", "cpu_flags", "kernels", "weights", "dtype"])
        info.add_metric([st.cpu, " ".join(sorted(st.cpu_flags)), st.kernels, st.weights,
                         st.dtype], 1)
        yield info
        if st.cache is not None:
            yield from _prefix_cache(st.cache)


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
        remote: Any = getattr(enc, "pool", None)
        if remote is not None and hasattr(remote, "down_count"):    # --encoder-worker
            yield CounterMetricFamily("mimo_encoder_retries", "Calls to a remote encoder that "
                                      "failed and moved to the next one", value=remote.retried)
            yield CounterMetricFamily("mimo_encoder_request_bytes", "Bytes sent to remote "
                                      "encoders (probes and misses' patches)",
                                      value=remote.bytes_sent)
            yield GaugeMetricFamily("mimo_encoder_workers_down", "Remote encoders marked down "
                                    "now (out of the ring until their retry time)",
                                    value=remote.down_count())


def _prefix_cache(c: Mapping[str, int]):
    """mimo_prefix_cache_window_cut_tokens_total{cause}: prompt tokens a cached prefix held
    but a missing SWA window kept from reuse; `never_kept` ones need a denser retention,
    `evicted` ones a larger SWA share. mimo_prefix_cache_freed_pages_total{pool,how}."""
    cut = CounterMetricFamily("mimo_prefix_cache_window_cut_tokens",
                              "Prompt tokens equal to a cached prefix but not reused "
                              "because the SWA window before them was missing", labels=["cause"])
    for cause in ("never_kept", "evicted"):
        cut.add_metric([cause], c.get(f"cut_{cause}", 0))
    yield cut
    freed = CounterMetricFamily("mimo_prefix_cache_freed_pages",
                                "Cached pages freed by eviction", labels=["pool", "how"])
    freed.add_metric(["full", "node"], c.get("evicted_full", 0))
    freed.add_metric(["swa", "node"], c.get("evicted_swa", 0))
    freed.add_metric(["swa", "swa_only"], c.get("tombstoned_swa", 0))
    yield freed
    yield CounterMetricFamily("mimo_prefix_cache_revived_swa_pages",
                              "Tombstoned SWA pages filled again by a request",
                              value=c.get("revived_swa", 0))
    yield CounterMetricFamily("mimo_prefix_cache_rebuilt_tokens",
                              "Prompt tokens reused past a missing SWA window by "
                              "recomputing only the SWA receptive field",
                              value=c.get("rebuilt_tokens", 0))
    yield CounterMetricFamily("mimo_prefix_cache_partial_tokens",
                              "Prompt tokens reused from the first rows of a cached page "
                              "after the whole pages, copied at admission",
                              value=c.get("partial_tokens", 0))
    yield CounterMetricFamily("mimo_prefix_cache_paused_sessions",
                              "Finished requests whose answer ended in a tool call, their "
                              "cached KV held after everything else (--tool-pause-hold)",
                              value=c.get("held", 0))
