"""Passing a stored response's reads and deletes through: GET and DELETE
/v1/responses/{id}, GET /v1/responses/{id}/input_items.

A worker keeps its responses in its own memory, or in a Redis store that every worker
shares. So the worker that made the response (when a router replica relayed it) is asked
first,
then every other healthy worker until one does not answer 404: with a shared store the
first answers, without one the maker does. A 404 comes back only when none has it.
"""
from __future__ import annotations

import httpx
from starlette.responses import Response

from .proxy import PASS_HEADERS, WORKER_HEADER, error_json
from .router import Router


async def pass_through(router: Router, request) -> Response:
    rid = request.path_params["response_id"]
    maker = await router.served_by(rid)
    live = [w for w in router.members if router.healthy.get(w)]
    order = ([maker] if maker in live else []) + [w for w in live if w != maker]
    headers = {k: v for k, v in request.headers.items() if k.lower() in PASS_HEADERS}
    url = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    last = None
    for w in order:
        try:
            r = await router.http.request(request.method, w + url, headers=headers,
                                          timeout=30)
        except httpx.HTTPError:
            continue
        last = Response(r.content, r.status_code, headers={WORKER_HEADER: w},
                        media_type=r.headers.get("content-type", "application/json"))
        if r.status_code != 404:
            if request.method == "DELETE" and r.status_code == 200:
                router.served.pop(rid, None)
            return last
    if last is not None:
        return last
    return error_json(503, "no healthy worker", "server_error", "no_worker")
