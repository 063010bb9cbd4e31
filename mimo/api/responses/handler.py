"""The /v1/responses endpoints: create (whole or streamed), retrieve, delete, input_items.

Create runs through chat's path: the chain's stored items (from `previous_response_id`), the
new input items and `instructions` become chat messages; the body's generation fields become
a chat body that `schemas.parse("chat", ...)` checks; its grammar (tools forced, or
`text.format` json_schema) compiles in mimo.structured; the responder starts the pipeline
request; chat's Choice (one OutputParser: reasoning, text, tool calls) reads the output and
output.OutputBuilder shapes it into Responses items and events. With `store` (the default)
the finished response is saved with its input items and the chain's context, which the next
turn continues from; `instructions` are not carried over, as OpenAI's are not.
"""
from __future__ import annotations

import dataclasses
import json
import time

from starlette.responses import JSONResponse, StreamingResponse

from ...tools import OutputParser
from .. import schemas
from ..choice import Choice
from ..errors import (
    APIError,
    InvalidSchema,
    ModelNotFound,
    bad_request,
    error_response,
    to_api_error,
)
from ..responder import ClientGone, Run, unless_disconnected
from ..response_format import closed
from .items import check_call_outputs, new_id, to_messages
from .output import OutputBuilder, usage
from .request import CHAT_PARAM, ResponsesRequest, parse_request, rename_params
from .store import ResponseStore, StoreUnavailable

EP = "responses"


def _not_found(rid: str) -> APIError:
    return APIError(404, f"no response with id {rid[:80]!r} (never stored, deleted, or "
                         f"expired)", param="response_id", code="not_found")


def _error(e: BaseException):
    """error_response, its param named as the Responses API names it (chat's parser and the
    prompt stage name chat's fields)."""
    err = to_api_error(e)
    err.param = CHAT_PARAM.get(err.param or "", err.param)
    return error_response(err)


class ResponsesAPI:
    def __init__(self, server, store: ResponseStore):
        self.s, self.store = server, store

    async def close(self) -> None:
        await self.store.close()

    # ---- the store ----------------------------------------------------------------------
    async def _call(self, fn, *args):
        try:
            return await fn(*args)
        except StoreUnavailable as e:
            raise APIError(503, str(e), "server_error", code="store_unavailable") from None

    async def _context(self, prev: str | None) -> list[dict]:
        if prev is None:
            return []
        rec = await self._call(self.store.get, prev)
        if rec is None:
            raise bad_request(f"previous response {prev[:80]!r} not found (never stored, "
                              f"stored with store: false, deleted, or expired)",
                              "previous_response_id", "previous_response_not_found")
        return rec["context"]

    async def _save(self, req: ResponsesRequest, resp: dict, context: list[dict]) -> None:
        if req.store:
            rec = {"response": resp, "input_items": req.items,
                   "context": context + req.items + resp["output"]}
            await self._call(self.store.put, resp["id"], rec)

    # ---- create -------------------------------------------------------------------------
    def _spec(self, req: ResponsesRequest, context: list[dict]) -> schemas.GenerationSpec:
        s = self.s
        body = {**req.chat, "messages": to_messages(req.instructions, context + req.items)}
        try:
            return schemas.parse("chat", body, s.max_model_len,
                                 multimodal=s.chat_pipeline.multimodal,
                                 vocab_size=s.info.vocab_size,
                                 tool_format=s.tool_format,
                                 default_max_tokens=s.cfg.default_max_tokens)
        except APIError as e:
            e.message = rename_params(e.message)
            raise

    def _choice(self, spec: schemas.GenerationSpec) -> Choice:
        tools = spec.tools
        decl = tools.tools if tools else ()
        parser = OutputParser(self.s.tool_format, tools is not None and tools.active, True,
                              {t.name: t.parameters for t in decl},
                              {t.name: closed(t.parameters) for t in decl if t.strict})
        return Choice(0, spec, self.s.tokenizer, parser)

    def _response(self, rid: str, req: ResponsesRequest, created: int, status: str,
                  output: list[dict], use: dict | None) -> dict:
        return {"id": rid, "object": "response", "created_at": created, "status": status,
                "error": None, "completed_at": int(time.time()) if use is not None else None,
                "incomplete_details": {"reason": "max_output_tokens"}
                if status == "incomplete" else None,
                "instructions": req.instructions, "model": self.s.model_name,
                "output": output, "previous_response_id": req.previous_response_id,
                "store": req.store, "reasoning": {"effort": None, "summary": None},
                "truncation": "disabled", "service_tier": "default", "background": False,
                "usage": use, **req.echo}

    async def create(self, request):
        s = self.s
        try:
            req = parse_request(await s._body(request))
            if req.model != s.model_name:
                raise ModelNotFound(req.model, s.model_name)
            context = await self._context(req.previous_response_id)
            check_call_outputs(context, req.items)
            spec = self._spec(req, context)
            if req.logprobs and self._choice(spec).parser is not None:
                raise bad_request("logprobs are not supported with tools or a reasoning "
                                  "model: the output parser holds text back, so tokens and "
                                  "text would not line up", "include",
                                  "unsupported_parameter")
            if spec.grammar is not None:
                try:
                    c = await s._constraint(spec)
                except InvalidSchema as e:
                    raise InvalidSchema("text.format" if spec.json_mode else "tools",
                                        e.detail) from None
                spec.params = dataclasses.replace(spec.params, constraint=c)
            runs = await s.responder.start(request, spec)
        except ClientGone:
            return s.responder.abandoned(EP)
        except Exception as e:  # noqa: BLE001 - every failure is answered in OpenAI's shape
            resp = _error(e)
            s.metrics.requests.labels(EP, str(resp.status_code)).inc()
            return resp
        turn = _Turn(self, req, context, spec, runs[0])
        if req.stream:
            return StreamingResponse(turn.events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            return await unless_disconnected(request, turn.whole())
        except ClientGone:
            return s.responder.abandoned(EP)

    # ---- retrieve, delete, input items ---------------------------------------------------
    async def _record(self, request) -> tuple[str, dict]:
        self.s._require_key(request)
        rid = request.path_params["response_id"]
        rec = await self._call(self.store.get, rid)
        if rec is None:
            raise _not_found(rid)
        return rid, rec

    async def retrieve(self, request):
        try:
            q = request.query_params
            if q.get("stream", "false") != "false" or q.getlist("include"):
                raise bad_request("'stream' and 'include' are not supported on retrieve",
                                  "stream" if "stream" in q else "include")
            _, rec = await self._record(request)
        except Exception as e:  # noqa: BLE001
            return error_response(e)
        return JSONResponse(rec["response"])

    async def delete(self, request):
        try:
            self.s._require_key(request)
            rid = request.path_params["response_id"]
            if not await self._call(self.store.delete, rid):
                raise _not_found(rid)
        except Exception as e:  # noqa: BLE001
            return error_response(e)
        return JSONResponse({"id": rid, "object": "response", "deleted": True})

    async def input_items(self, request):
        try:
            _, rec = await self._record(request)
            items = _page(rec["input_items"], request.query_params)
        except Exception as e:  # noqa: BLE001
            return error_response(e)
        return JSONResponse(items)


def _page(items: list[dict], q) -> dict:
    """`limit` (1-100, default 20), `order` (asc | desc, default desc), `after` (an item id)."""
    unknown = sorted(set(q) - {"limit", "order", "after", "include"})
    if unknown or q.getlist("include"):
        name = unknown[0][:40] if unknown else "include"
        raise bad_request(f"query parameter {name!r} is not supported", name)
    lim = q.get("limit", "20")
    if not lim.isdigit() or not 1 <= int(lim) <= 100:
        raise bad_request("'limit' must be an integer in [1, 100]", "limit")
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request("'order' must be 'asc' or 'desc'", "order")
    seq = items if order == "asc" else items[::-1]
    after = q.get("after")
    if after is not None:
        ids = [it["id"] for it in seq]
        if after not in ids:
            raise bad_request(f"'after' {after[:80]!r} is not an item of this response",
                              "after")
        seq = seq[ids.index(after) + 1:]
    data = seq[:int(lim)]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(seq) > len(data)}


class _Turn:
    """One create's generation, answered whole or as Responses stream events."""

    def __init__(self, api: ResponsesAPI, req: ResponsesRequest, context: list[dict],
                 spec: schemas.GenerationSpec, run: Run):
        self.api, self.req, self.context, self.run = api, req, context, run
        self.rid, self.created = new_id("resp"), int(time.time())
        self.choice = api._choice(spec)
        self.builder = OutputBuilder(self.choice)
        self.reasoning_tokens = 0

    def _feed(self, item) -> list[dict]:
        p = self.choice.parser
        before = p.mode if p is not None else "content"
        lps = None
        if self.req.logprobs:
            chat = self.choice.chat_logprobs(item.logprobs)
            assert chat is not None, "a logprobs request's chat spec asks for logprobs"
            lps = chat["content"]
        events = self.builder.feed(self.choice.feed(item), lps)
        if p is not None and "reasoning" in (before, p.mode):
            self.reasoning_tokens += len(item.token_ids)
        return events

    async def _finish(self) -> tuple[dict, list[dict]]:
        status = "incomplete" if self.choice.finish == "length" else "completed"
        events = self.builder.finish(status)
        resp = self.api._response(self.rid, self.req, self.created, status,
                                  self.builder.items,
                                  usage(self.run.req.usage, self.reasoning_tokens))
        await self.api._save(self.req, resp, self.context)
        if self.builder.items and self.builder.items[-1]["type"] == "function_call":
            self.api.s.responder.pause(self.run.req)    # the client runs the tool
        return resp, events

    def _done(self, status: str | None) -> None:
        s = self.api.s
        if status is None:              # cancelled: the client went away mid-stream
            s.metrics.aborted.labels(EP).inc()
            status = "499"
        s.responder._account(self.run.req)
        s.metrics.requests.labels(EP, status).inc()
        s.metrics.e2e.observe(time.perf_counter() - self.run.t0)

    async def whole(self):
        item, status = self.run.first, None
        try:
            while item is not None:
                self._feed(item)
                item = await anext(self.run.stream, None)
            resp, _ = await self._finish()
            status = "200"
            return JSONResponse(resp)
        except Exception as e:  # noqa: BLE001
            r = _error(e)
            status = str(r.status_code)
            return r
        finally:
            await self.run.stream.aclose()
            if status is None:      # cancelled: the caller answers it as abandoned
                self.api.s.responder._account(self.run.req)
            else:
                self._done(status)

    async def events(self):
        seq = 0

        def sse(e: dict) -> bytes:
            nonlocal seq
            e = {"type": e["type"], "sequence_number": seq, **e}
            seq += 1
            return (f"event: {e['type']}\ndata: ".encode() +
                    json.dumps(e, ensure_ascii=False).encode() + b"\n\n")

        snap = self.api._response(self.rid, self.req, self.created, "in_progress", [], None)
        status = None
        try:
            yield sse({"type": "response.created", "response": snap})
            yield sse({"type": "response.in_progress", "response": snap})
            item = self.run.first
            while item is not None:
                for e in self._feed(item):
                    yield sse(e)
                item = await anext(self.run.stream, None)
            resp, events = await self._finish()
            for e in events:
                yield sse(e)
            kind = "response.incomplete" if resp["status"] == "incomplete" else \
                "response.completed"
            yield sse({"type": kind, "response": resp})
            status = "200"
        except Exception as e:  # noqa: BLE001 - headers are out: report in-band, then end
            err = to_api_error(e)
            status = str(err.status)
            code = "server_error" if err.status >= 500 else "invalid_prompt"
            failed = {**snap, "status": "failed", "error": {"code": code,
                                                            "message": err.message}}
            yield sse({"type": "response.failed", "response": failed})
        finally:
            await self.run.stream.aclose()
            self._done(status)
