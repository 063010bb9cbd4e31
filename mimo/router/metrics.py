"""The router's Prometheus metrics (own registry), per worker where it means something:
  mimo_router_requests_total{worker,status}            requests answered through the worker
  mimo_router_prompt_tokens_total{worker}              prompt tokens (the router's count)
  mimo_router_predicted_cached_tokens_total{worker}    predicted cached tokens, every request
  mimo_router_predicted_tier_tokens_total{worker,tier}  the predicted cached tokens by the tier
      their KV comes from (l1: the worker's tree, l2: its host tier, l3: the shared store)
  mimo_router_credited_tokens_total{worker}           the score's weighted tokens (tiers below
      L1 at --l2-credit / --l3-credit): not comparable with the actual ones
  mimo_router_measured_predicted_tokens_total{worker}  the predicted tokens (every tier), for
      requests whose usage was
      seen (non-streamed, or streamed with include_usage): compare with
  mimo_router_actual_cached_tokens_total{worker}       cached tokens the worker reported
  mimo_router_retries_total{worker}                    requests moved off the worker (it failed
      before sending a byte)
  mimo_router_stream_errors_total{worker}              streams under way that the worker broke
  mimo_router_resumed_streams_total{worker}           broken deterministic streams that the
      worker continued (resumed where the client was)
  mimo_router_decisions_total{how}                     score, fallback (Redis away), round-robin
  mimo_router_redis_errors_total{op}                   failed state reads and writes
  mimo_router_decision_seconds                         time to decide (tokenize, read, score)
  mimo_router_inflight{worker}                         this replica's requests in flight
  mimo_router_worker_up{worker}                        1 healthy, 0 out of the routing set
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class RouterMetrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        w = ["worker"]
        self.requests = Counter("mimo_router_requests", "Requests", ["worker", "status"],
                                registry=r)
        self.prompt = Counter("mimo_router_prompt_tokens", "Prompt tokens", w, registry=r)
        self.predicted = Counter("mimo_router_predicted_cached_tokens",
                                 "Predicted cached tokens", w, registry=r)
        self.tier_predicted = Counter("mimo_router_predicted_tier_tokens",
                                      "Predicted cached tokens by the tier they come from",
                                      ["worker", "tier"], registry=r)
        self.credited = Counter("mimo_router_credited_tokens",
                                "Predicted cached tokens weighted by tier (the score's)", w,
                                registry=r)
        self.measured_predicted = Counter("mimo_router_measured_predicted_tokens",
                                          "Predicted cached tokens of requests with usage",
                                          w, registry=r)
        self.actual = Counter("mimo_router_actual_cached_tokens",
                              "Cached tokens the worker reported", w, registry=r)
        self.retries = Counter("mimo_router_retries", "Requests moved off a failed worker",
                               w, registry=r)
        self.stream_errors = Counter("mimo_router_stream_errors",
                                     "Streams broken by their worker", w, registry=r)
        self.resumed = Counter("mimo_router_resumed_streams",
                               "Broken streams continued on the worker", w, registry=r)
        self.decisions = Counter("mimo_router_decisions", "Decisions", ["how"], registry=r)
        self.redis_errors = Counter("mimo_router_redis_errors", "Redis failures", ["op"],
                                    registry=r)
        self.decision = Histogram("mimo_router_decision_seconds", "Time to decide",
                                  buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25,
                                           0.5, 1.0), registry=r)
        self.inflight = Gauge("mimo_router_inflight", "In-flight requests", w, registry=r)
        self.up = Gauge("mimo_router_worker_up", "Worker in the routing set", w, registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
