"""The tiers' partial credit end to end: real workers with a host tier and one shared disk
store publish their tier sets to a real Redis; the router reads them. A prompt one worker
computed is credited to every worker on the store (at --l3-credit), and when the worker
that holds it in its tree is taken out, the one that gets it reports the cached tokens the
router predicted, which came from the store."""
from __future__ import annotations

import httpx

from .conftest import (
    chat_raw,
    decide,
    decide_when,
    start_router,
    start_workers,
    stop_all,
    wait_published,
)


def test_store_pages_are_credited_to_every_worker_and_predicted(redis_server, tiny_dir,
                                                                 tmp_path):
    r = redis_server
    ws = start_workers(tiny_dir, r.url, 2, "--kv-storage", f"file:{tmp_path}",
                       "--host-kv-cache-memory", "8MiB")
    rt = None
    try:
        wait_published(r.url, ws)
        rt = start_router(tiny_dir, r.url, ws, "--l3-credit", "0.5")
        model = str(tiny_dir)
        msgs = [{"role": "system", "content": "tiered system prompt, shared by all " * 10},
                {"role": "user", "content": "what does the store hold?"}]
        body = {"model": model, "messages": msgs, "max_tokens": 4}
        first, holder = chat_raw(rt, model, msgs, max_tokens=4)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        # Published: the holder's tree, and the store's set (written through).
        d = decide_when(rt, body,
                        lambda d: d["predicted_cached_tokens"] > 0 and d["worker"] == holder)
        assert d["worker"] == holder and d["predicted_by_tier"]["l1"] == d[
            "predicted_cached_tokens"], d
        whole = d["predicted_cached_tokens"]
        other = next(w.url for w in ws if w.url != holder)
        assert httpx.request("DELETE", rt.url + "/router/workers",
                             json={"url": holder}).status_code == 200
        d = decide(rt, body)
        assert d["worker"] == other
        assert d["predicted_cached_tokens"] == whole == d["predicted_by_tier"]["l3"], d
        assert d["credited_tokens"] == 0.5 * whole
        resp, w = chat_raw(rt, model, msgs, max_tokens=4)
        assert w == other
        assert resp.usage.prompt_tokens_details.cached_tokens == whole
        m = rt.counters()
        assert m["mimo_router_predicted_tier_tokens_total"] == {"l3": whole}    # by tier
    finally:
        stop_all(rt, ws)
