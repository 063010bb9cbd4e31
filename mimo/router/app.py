"""The router's HTTP front (starlette): the OpenAI endpoints forwarded, plus its own.

  POST /v1/chat/completions, /v1/completions   routed (proxy.Forwarder)
  POST /v1/responses                           routed: to the worker that made the
                                               previous_response_id while it is healthy
  GET, DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items
                                               passed through (lookup.py)
  GET  /v1/models, /v1/models/{id}             from a healthy worker
  GET  /health                                 200 while some worker is healthy (503 else)
  GET  /metrics                                the router's metrics (metrics.py)
  GET  /router/workers                         the routing set and each worker's state
  POST /router/workers {"url"}                 add a worker; DELETE with the same body: remove
  POST /router/decide {"kind", "body"}         the decision for a body (kind: chat,
                                               completion, responses), without sending it
"""
from __future__ import annotations

import contextlib
import json

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .lookup import pass_through
from .proxy import PASS_HEADERS, Forwarder, error_json
from .router import NoWorker, Router


def build_app(router: Router) -> Starlette:
    fwd = Forwarder(router)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await router.start()
        try:
            yield
        finally:
            await router.stop()

    async def chat(request):
        return await fwd.forward(request, "chat", "/v1/chat/completions")

    async def completions(request):
        return await fwd.forward(request, "completion", "/v1/completions")

    async def responses(request):
        return await fwd.forward(request, "responses", "/v1/responses")

    async def stored(request):
        return await pass_through(router, request)

    async def models(request):
        return await _models(router, request)

    async def health(request):
        up = [w for w in router.members if router.healthy.get(w)]
        return JSONResponse({"status": "ok" if up else "no_worker", "workers": len(up)},
                            200 if up else 503)

    async def metrics(request):
        return Response(router.metrics.render(), media_type="text/plain; version=0.0.4")

    async def workers(request):
        return await _workers(router, request)

    async def decide(request):
        return await _decide(router, request)

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/responses/{response_id}", stored, methods=["GET", "DELETE"]),
        Route("/v1/responses/{response_id}/input_items", stored, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/router/workers", workers, methods=["GET", "POST", "DELETE"]),
        Route("/router/decide", decide, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


async def _models(router: Router, request):
    headers = {k: v for k, v in request.headers.items() if k.lower() in PASS_HEADERS}
    for w in router.members:
        if not router.healthy.get(w):
            continue
        try:
            r = await router.http.get(w + request.url.path, headers=headers, timeout=5)
        except httpx.HTTPError:
            continue
        return Response(r.content, r.status_code, media_type="application/json")
    return error_json(503, "no healthy worker", "server_error", "no_worker")


async def _workers(router: Router, request):
    if request.method == "GET":
        return JSONResponse({"workers": [
            {"url": w, "healthy": bool(router.healthy.get(w)),
             "inflight": router.inflight.get(w, 0)} for w in router.members]})
    try:
        url = json.loads(await request.body())["url"].rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(url)
    except (ValueError, KeyError, TypeError, AttributeError):
        return error_json(400, "the body must be {\"url\": \"http://HOST:PORT\"}",
                          "invalid_request_error", "invalid_body")
    try:
        if request.method == "POST":
            await router.add_worker(url)
        else:
            await router.remove_worker(url)
    except Exception as e:  # noqa: BLE001 - Redis away: the change is not shared
        return error_json(503, f"router state unavailable: {e}", "server_error",
                          "state_unavailable")
    return JSONResponse({"ok": True, "workers": router.members})


async def _decide(router: Router, request):
    try:
        q = json.loads(await request.body())
        kind, body = q["kind"], q["body"]
    except (ValueError, KeyError, TypeError):
        return error_json(400, "the body must be {\"kind\": \"chat\"|\"completion\"|"
                               "\"responses\", \"body\": {...}}", "invalid_request_error",
                          "invalid_body")
    try:
        d = await router.decide(kind, body)
    except NoWorker:
        return error_json(503, "no healthy worker", "server_error", "no_worker")
    return JSONResponse({"worker": d.url, "predicted_cached_tokens": d.predicted,
                         "predicted_by_tier": dict(zip(("l1", "l2", "l3"), d.tiers)),
                         "credited_tokens": d.credited, "prompt_tokens": d.prompt_len,
                         "how": d.how, "score": d.score, "prefill": d.prefill})
