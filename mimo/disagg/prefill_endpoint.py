"""PrefillEndpoint: a prefill worker's POST /v1/internal/prefill.

Body (JSON): {"prompt_ids": [...], "cache_salt": str|null, "session": str|null,
"fingerprint": str}. The prompt runs through this worker's engine with max_tokens 1
(greedy), its prefix cache included; once its last token is computed the engine hands over a
host copy of its KV (every full layer's pages, each SWA layer's window), and the answer is
the binary stream of `wire` (200, application/octet-stream), one frame per layer.
Errors before the stream are JSON in OpenAI's shape: 400 for a bad body or a prompt the
engine refuses, 401 without the key, 409 when the caller's model or KV layout differs.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

from starlette.responses import StreamingResponse

from ..api.body import read_json
from ..api.errors import APIError, bad_request, error_response
from ..kvcache.kv_payload import full_kv_bytes
from ..kvcache.pool.layout import KVLayout
from ..kvcache.radix.namespace import CacheScope
from . import wire
from .transfer_stats import TransferStats


def _parse(body: object) -> tuple[list[int], CacheScope, str]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    unknown = set(body) - {"prompt_ids", "cache_salt", "session", "fingerprint"}
    if unknown:
        raise bad_request(f"unknown fields: {', '.join(sorted(unknown))}")
    ids = body.get("prompt_ids")
    if not isinstance(ids, list) or not ids or any(
            isinstance(t, bool) or not isinstance(t, int) for t in ids):
        raise bad_request("prompt_ids must be a non-empty list of integers", "prompt_ids")
    fp = body.get("fingerprint")
    if not isinstance(fp, str):
        raise bad_request("fingerprint must be a string", "fingerprint")
    try:
        scope = CacheScope(body.get("cache_salt"), body.get("session"))
    except ValueError as e:
        raise bad_request(str(e)) from None
    return ids, scope, fp


class PrefillEndpoint:
    def __init__(self, server, fingerprint: str, layout: KVLayout):
        self.s = server
        self.fingerprint, self.layout = fingerprint, layout
        self.stats = TransferStats()

    async def handle(self, request):
        s, stream = self.s, None
        t0 = time.perf_counter()
        try:
            s._require_key(request)
            body = await read_json(request, s.cfg.max_body_bytes, s.cfg.body_read_timeout)
            ids, scope, fp = _parse(body)
            if fp != self.fingerprint:
                raise APIError(409, "this prefill worker serves another model or KV layout",
                               "invalid_request_error", "fingerprint", "kv_layout_mismatch")
            stream = s.engine.submit_prefill(ids, scope)
            async for ev in stream:
                first = ev.token_ids[0] if ev.token_ids else None
        except Exception as e:  # noqa: BLE001 - answered in OpenAI's shape
            if stream is not None:
                s.engine.abort(stream)
            self.stats.failed += stream is not None
            return error_response(e)
        payload = stream.seq.exported
        if payload is None or first is None:        # aborted, or ended without its prompt
            self.stats.failed += 1
            return error_response(RuntimeError("the prefill ended without its KV"))
        stream.seq.exported = None
        self.stats.prefill_seconds += time.perf_counter() - t0
        chunks = wire.encode(first, stream.seq.cached_tokens, payload, self.fingerprint)
        return StreamingResponse(self._send(chunks, payload.nbytes,
                                            full_kv_bytes(self.layout, payload.tokens)),
                                 media_type="application/octet-stream")

    def _send(self, chunks: Iterator[bytes | memoryview], kv_bytes: int, full: int
              ) -> Iterator[bytes | memoryview]:
        """The chunks as starlette sends them (each layer is on the socket before the next
        is made), counted once all went out."""
        t0, sent = time.perf_counter(), 0
        for c in chunks:
            sent += len(c)
            yield c
        st = self.stats
        st.transfers += 1
        st.wire_bytes += sent
        st.kv_bytes += kv_bytes
        st.full_kv_bytes += full
        st.send_seconds += time.perf_counter() - t0
