"""/metrics for the KV tiers below L1 (mimo/kvcache/tiers/), from the engine's snapshot.

  mimo_kv_tier_hit_tokens_total{tier}         prompt tokens each tier served (l1, l2, l3;
                                              l2/l3: tokens whose full KV they supplied)
  mimo_kv_tier_miss_tokens_total{tier}        admitted prompt tokens no tier served
  mimo_kv_tier_read_bytes_total{tier}         KV bytes loaded from the tier into L1
  mimo_kv_tier_written_bytes_total{tier}      KV bytes written into the tier
  mimo_kv_tier_pages_total{tier,kind,op}      pages read / written, by kind (full, swa)
  mimo_kv_host_pages{kind,state}              L2 pages by state (free, evictable, in_use, capacity)
  mimo_kv_storage_errors_total{cause}         L3 keys that missed or failed to store, by cause
                                              (timeout, unavailable, corrupt, full, error)
  mimo_kv_storage_dropped_writes_total{why}   pages not written (queue full, backend refused)
  mimo_kv_storage_load_seconds                L3 lookup latency (histogram)
  mimo_kv_tier_load_errors_total              promotions that raised (the request recomputed)
"""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from ..engine.face import EngineStats, StorageCounts

KINDS = {"f": "full", "s": "swa"}


class TierCollector:
    def __init__(self, stats: Callable[[], EngineStats]):
        self.stats = stats      # the engine's snapshot (AsyncEngine.stats)

    def collect(self):
        t = self.stats().tiers
        if t is None:
            return
        fams = {
            "hit": CounterMetricFamily("mimo_kv_tier_hit_tokens", "Prompt tokens served, by "
                                       "tier", labels=["tier"]),
            "miss": CounterMetricFamily("mimo_kv_tier_miss_tokens", "Admitted prompt tokens "
                                        "no tier served", labels=["tier"]),
            "read": CounterMetricFamily("mimo_kv_tier_read_bytes", "KV bytes loaded into L1, "
                                        "by tier", labels=["tier"]),
            "written": CounterMetricFamily("mimo_kv_tier_written_bytes", "KV bytes written, "
                                           "by tier", labels=["tier"]),
        }
        pages = CounterMetricFamily("mimo_kv_tier_pages", "KV pages read or written, by tier "
                                    "and kind", labels=["tier", "kind", "op"])
        fams["hit"].add_metric(["l1"], t.l1_hit_tokens)
        for c in t.tiers:
            fams["hit"].add_metric([c.name], c.hit_tokens)
            fams["miss"].add_metric([c.name], c.miss_tokens)
            fams["read"].add_metric([c.name], c.bytes_read)
            fams["written"].add_metric([c.name], c.bytes_written)
            for k, kind in KINDS.items():
                pages.add_metric([c.name, kind, "read"], c.pages_read[k])
                pages.add_metric([c.name, kind, "write"], c.pages_written[k])
        yield from fams.values()
        yield pages
        yield CounterMetricFamily("mimo_kv_tier_load_errors", "Tier loads that raised (the "
                                  "request recomputed)", value=t.load_errors)
        if t.host_pages is not None:
            g = GaugeMetricFamily("mimo_kv_host_pages", "Host-memory KV tier pages by state",
                                  labels=["kind", "state"])
            for k, st in t.host_pages.items():
                for state in ("free", "evictable", "in_use", "capacity"):
                    g.add_metric([KINDS[k], state], st[state])
            yield g
        if t.storage is not None:
            yield from _storage(t.storage)


def _storage(s: StorageCounts):
    err = CounterMetricFamily("mimo_kv_storage_errors", "KV storage keys that missed or "
                              "failed, by cause", labels=["cause"])
    for cause, n in s.errors.items():
        err.add_metric([cause], n)
    yield err
    drop = CounterMetricFamily("mimo_kv_storage_dropped_writes", "KV pages not written to "
                               "storage", labels=["why"])
    drop.add_metric(["queue_full"], s.dropped)
    drop.add_metric(["refused"], s.refused)
    yield drop
    buckets = [(str(ub) if ub != float("inf") else "+Inf", n) for ub, n in s.latency_buckets]
    yield HistogramMetricFamily("mimo_kv_storage_load_seconds", "KV storage lookup "
                                "latency", buckets=buckets, sum_value=s.latency_sum)
