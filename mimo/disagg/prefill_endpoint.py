"""PrefillEndpoint: a prefill worker's POST /v1/internal/prefill.

Body (JSON): {"prompt_ids": [...], "cache_salt": str|null, "session": str|null,
"fingerprint": str, "wire": int}. The prompt runs through this worker's engine with
max_tokens 1 (greedy), its prefix cache included. The answer (200,
application/octet-stream) is the binary stream of `wire`, written while the prompt is
computed (`KVSender`): the engine hands over host copies of the KV frame by frame (every
full layer's pages, each SWA layer's window) as soon as each is final, and the first token
ends the stream. Errors before the stream are JSON in OpenAI's shape: 400 for a bad body or
a prompt the engine refuses, 401 without the key, 409 when the caller's model, KV layout or
wire format differs. A failure after the 200 ends the stream short (a recompute on the
decode worker).
"""
from __future__ import annotations

import asyncio
import time

from ..api.body import read_json
from ..api.errors import APIError, bad_request, error_response
from ..kvcache.kv_payload import full_kv_bytes, payload_shapes
from ..kvcache.pool.layout import KVLayout
from ..kvcache.radix.namespace import CacheScope
from . import wire
from .frame_queue import FrameQueue
from .kv_sender import KVSender
from .transfer_stats import TransferStats

FIELDS = {"prompt_ids", "cache_salt", "session", "fingerprint", "wire"}


def _parse(body: object) -> tuple[list[int], CacheScope, str, object]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    unknown = set(body) - FIELDS
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
    return ids, scope, fp, body.get("wire")


def _tensor_bytes(layout: KVLayout, tokens: int, page_size: int) -> int:
    _, full, swa = payload_shapes(layout, tokens, page_size)
    elems = sum(k[0] * k[1] * k[2] + v[0] * v[1] * v[2] for k, v in full + swa)
    return elems * layout.dtype_bytes


class PrefillEndpoint:
    def __init__(self, server, fingerprint: str, layout: KVLayout):
        self.s = server
        self.fingerprint, self.layout = fingerprint, layout
        self.stats = TransferStats()
        self.last: KVSender | None = None       # the latest transfer (tests read it)

    async def handle(self, request):
        s = self.s
        t0 = time.perf_counter()
        try:
            s._require_key(request)
            body = await read_json(request, s.cfg.max_body_bytes, s.cfg.body_read_timeout)
            ids, scope, fp, version = _parse(body)
            if version != wire.VERSION:
                raise APIError(409, f"this prefill worker speaks KV wire format {wire.VERSION}, "
                               f"not {version!r}", "invalid_request_error", "wire",
                               "kv_wire_mismatch")
            if fp != self.fingerprint:
                raise APIError(409, "this prefill worker serves another model or KV layout",
                               "invalid_request_error", "fingerprint", "kv_layout_mismatch")
            frames = FrameQueue(asyncio.get_running_loop())
            stream = s.engine.submit_prefill(ids, frames, scope)
        except Exception as e:  # noqa: BLE001 - answered in OpenAI's shape
            return error_response(e)
        info = s.engine.info
        head = wire.header(self.layout, len(ids), info.page_size, info.dtype, self.fingerprint)
        self.last = KVSender(s.engine, stream, frames, head,
                             _tensor_bytes(self.layout, len(ids), info.page_size),
                             full_kv_bytes(self.layout, len(ids)), self.stats, t0)
        return self.last
