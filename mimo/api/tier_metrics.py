"""/metrics for the KV tiers below L1 (mimo/kvcache/tiers/), read at scrape time.

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

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

KINDS = {"f": "full", "s": "swa"}


class TierCollector:
    def __init__(self, cache):
        self.cache = cache      # a TieredPrefixCache

    def collect(self):
        c = self.cache          # racy reads of plain ints: fine for monitoring
        tiers = [("l2", c.l2)] if c.host is not None else []
        if c.storage is not None:
            tiers.append(("l3", c.l3))
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
        fams["hit"].add_metric(["l1"], c.l1_hit_tokens)
        for name, t in tiers:
            fams["hit"].add_metric([name], t.hit_tokens)
            fams["miss"].add_metric([name], t.miss_tokens)
            fams["read"].add_metric([name], t.bytes_read)
            fams["written"].add_metric([name], t.bytes_written)
            for k, kind in KINDS.items():
                pages.add_metric([name, kind, "read"], t.pages_read[k])
                pages.add_metric([name, kind, "write"], t.pages_written[k])
        yield from fams.values()
        yield pages
        yield CounterMetricFamily("mimo_kv_tier_load_errors", "Tier loads that raised (the "
                                  "request recomputed)", value=c.load_errors)
        if c.host is not None:
            g = GaugeMetricFamily("mimo_kv_host_pages", "Host-memory KV tier pages by state",
                                  labels=["kind", "state"])
            for k, st in c.host.stats().items():
                for state in ("free", "evictable", "in_use", "capacity"):
                    g.add_metric([KINDS[k], state], st[state])
            yield g
        if c.storage is not None:
            yield from self._storage(c.storage)

    def _storage(self, st):
        b = st.storage.stats
        err = CounterMetricFamily("mimo_kv_storage_errors", "KV storage keys that missed or "
                                  "failed, by cause", labels=["cause"])
        for cause, n in b.errors.items():
            extra = st.stats.fetch_timeouts if cause == "timeout" else 0
            err.add_metric([cause], n + extra)
        yield err
        drop = CounterMetricFamily("mimo_kv_storage_dropped_writes", "KV pages not written to "
                                   "storage", labels=["why"])
        drop.add_metric(["queue_full"], st.stats.dropped)
        drop.add_metric(["refused"], st.stats.failed)
        yield drop
        w = st.stats
        from ..kvcache.tiers.storage_tier import LATENCY_BUCKETS
        acc, buckets = 0, []
        for ub, n in zip((*LATENCY_BUCKETS, float("inf")), w.latency_counts):
            acc += n
            buckets.append((str(ub) if ub != float("inf") else "+Inf", acc))
        yield HistogramMetricFamily("mimo_kv_storage_load_seconds", "KV storage lookup "
                                    "latency", buckets=buckets, sum_value=w.latency_sum)
