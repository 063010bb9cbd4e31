"""The OpenAI-compatible HTTP app (starlette). Handlers parse, run the stage pipeline
(chat_pipeline.py: [media stages] -> prompt -> generate -> detokenize) on a typed
ChatRequest, read usage and timings from it and shape OpenAI responses; errors go through
`errors.error_response`, the one place exceptions become HTTP."""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..config import ServerConfig
from ..engine.async_engine import AsyncEngine
from ..multimodal.config import MediaConfig
from ..stages import ChatRequest
from . import schemas
from .chat_pipeline import build_chat_pipeline, chat_request
from .errors import APIError, bad_request, error_body, error_response, to_api_error
from .metrics import Metrics


class Server:
    def __init__(self, cfg: ServerConfig, engine: AsyncEngine, model_name: str,
                 media: MediaConfig | None = None):
        self.cfg = cfg
        self.engine = engine
        self.model_name = cfg.served_model_name or model_name
        eng = engine.engine
        self.max_model_len = eng.max_model_len
        self.tokenizer = eng.tokenizer
        self.metrics = Metrics()
        self.chat_pipeline = build_chat_pipeline(cfg, engine, media)
        self.pipeline = self.chat_pipeline.pipeline
        if self.chat_pipeline.multimodal:
            self.metrics.watch_encoder(self.chat_pipeline.encode)
        self.metrics.watch_engine(eng)
        if eng.cache is not None:
            self.metrics.watch_prefix_cache(eng.cache)

    # ---- plumbing -------------------------------------------------------------------
    def _authorized(self, request) -> bool:
        if not self.cfg.api_key:
            return True
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        # Compare bytes: compare_digest raises TypeError on non-ASCII str, and header values
        # can hold any latin-1 character.
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode("utf-8"), self.cfg.api_key.encode("utf-8"))

    async def _body(self, request) -> dict:
        if not self._authorized(request):
            raise APIError(401, "missing or invalid API key (Authorization: Bearer ...)",
                           "authentication_error", code="invalid_api_key")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.cfg.max_body_bytes:
            raise APIError(413, f"request body over {self.cfg.max_body_bytes} bytes")
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.cfg.max_body_bytes:
                    raise APIError(413, f"request body over {self.cfg.max_body_bytes} bytes")
                chunks.append(chunk)
        except ClientDisconnect:
            raise APIError(400, "client disconnected while sending the body") from None
        raw = b"".join(chunks)
        if not raw.strip():
            raise bad_request("request body is empty; expected a JSON object")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise bad_request(f"request body is not valid UTF-8 (byte {e.start})") from None
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise bad_request(f"request body is not valid JSON: {e.msg} at line {e.lineno} "
                              f"column {e.colno}") from None
        except RecursionError:
            raise bad_request("request body is not valid JSON: nested too deeply") from None
        except ValueError as e:     # e.g. an integer literal over Python's 4300-digit limit
            raise bad_request(f"request body is not valid JSON: {e}") from None

    # ---- endpoints ------------------------------------------------------------------
    async def health(self, request):
        if self.engine.fatal is not None:
            return JSONResponse({"status": "error", "detail": str(self.engine.fatal)}, 503)
        return JSONResponse({"status": "ok"})

    async def models(self, request):
        if not self._authorized(request):
            return error_response(APIError(401, "missing or invalid API key", "authentication_error",
                                           code="invalid_api_key"))
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "mimo",
             "max_model_len": self.max_model_len}]})

    async def metrics_endpoint(self, request):
        self.metrics.observe_engine(self.engine.engine, self.engine.steps)
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def chat(self, request):
        return await self._generate(request, "chat")

    async def completions(self, request):
        return await self._generate(request, "completion")

    async def _generate(self, request, kind: str):
        endpoint = "chat" if kind == "chat" else "completions"
        try:
            spec = schemas.parse(kind, await self._body(request), self.max_model_len,
                                 multimodal=self.chat_pipeline.multimodal)
            if spec.model != self.model_name:
                raise APIError(404, f"model {spec.model!r} does not exist; this server serves "
                                    f"{self.model_name!r}", code="model_not_found", param="model")
            req = chat_request(spec)
            stream = self.pipeline.stream(req)
            t0 = time.perf_counter()
            try:
                # Errors before the first token -> HTTP. A client that leaves meanwhile
                # (a long prefill) is noticed here, and its request aborted.
                first = await _unless_disconnected(request, anext(stream, None))
            except BaseException:
                await stream.aclose()
                raise
        except ClientGone:
            return self._abandoned(endpoint)
        except Exception as e:  # noqa: BLE001 - every failure is answered in OpenAI's shape
            resp = error_response(e)
            self.metrics.requests.labels(endpoint, str(resp.status_code)).inc()
            return resp
        self.metrics.ttft.observe(time.perf_counter() - t0)
        if spec.stream:
            return StreamingResponse(self._sse(kind, spec, req, stream, first, t0),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            return await _unless_disconnected(
                request, self._whole(kind, spec, req, stream, first, t0))
        except ClientGone:          # _whole's stream was closed: the engine aborts it
            return self._abandoned(endpoint)

    def _abandoned(self, endpoint: str) -> Response:
        """The client went away before its answer was complete: counted as such (never as a
        200); the response goes nowhere."""
        self.metrics.aborted.labels(endpoint).inc()
        self.metrics.requests.labels(endpoint, "499").inc()
        return Response(status_code=499)

    @staticmethod
    def _usage(req: ChatRequest) -> dict:
        u = req.usage
        return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                "total_tokens": u.prompt_tokens + u.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}

    def _account(self, req: ChatRequest) -> None:
        """Count a finished request's tokens and queue wait (once, streamed or not)."""
        u = req.usage
        self.metrics.prompt_tokens.inc(u.prompt_tokens)
        self.metrics.generation_tokens.inc(u.completion_tokens)
        self.metrics.cached_tokens.inc(u.cached_tokens)
        if req.engine_queue_wait is not None:
            self.metrics.observe_queue_wait(req.engine_queue_wait)

    async def _collect(self, stream, first):
        text, finish = [], None
        item = first
        try:
            while item is not None:
                delta, reason = item
                text.append(delta)
                finish = reason or finish
                item = await anext(stream, None)
        finally:
            await stream.aclose()
        return "".join(text), finish

    async def _whole(self, kind, spec, req, stream, first, t0):
        endpoint = "chat" if kind == "chat" else "completions"
        try:
            text, finish = await self._collect(stream, first)
        except Exception as e:  # noqa: BLE001
            resp = error_response(e)
            self.metrics.requests.labels(endpoint, str(resp.status_code)).inc()
            return resp
        self.metrics.e2e.observe(time.perf_counter() - t0)
        self.metrics.requests.labels(endpoint, "200").inc()
        self._account(req)
        rid, created = _id(kind), int(time.time())
        if kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "finish_reason": finish, "logprobs": None}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            obj = "text_completion"
        return JSONResponse({"id": rid, "object": obj, "created": created,
                             "model": self.model_name, "choices": [choice],
                             "usage": self._usage(req)})

    async def _sse(self, kind, spec, req, stream, first, t0):
        endpoint = "chat" if kind == "chat" else "completions"
        rid, created = _id(kind), int(time.time())
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"

        def chunk(delta=None, finish=None, role=False):
            if kind == "chat":
                d = {"role": "assistant", "content": ""} if role else (
                    {"content": delta} if delta else {})
                choice = {"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}
            else:
                choice = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
            return _event({"id": rid, "object": obj, "created": created,
                           "model": self.model_name, "choices": [choice]})

        status = None           # set once the answer is complete or failed
        last = time.perf_counter()
        try:
            if kind == "chat":
                yield chunk(role=True)
            item = first
            while item is not None:
                delta, reason = item
                now = time.perf_counter()
                self.metrics.itl.observe(now - last)
                last = now
                if delta or reason:
                    yield chunk(delta, reason)
                item = await anext(stream, None)
            if spec.include_usage:
                yield _event({"id": rid, "object": obj, "created": created,
                              "model": self.model_name, "choices": [], "usage": self._usage(req)})
            status = "200"
            yield b"data: [DONE]\n\n"
        except Exception as e:  # noqa: BLE001 - headers are out: report in-band, then end
            err = to_api_error(e)
            status = str(err.status)
            yield _event(error_body(err))
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()
            self._account(req)
            if status is None:      # cancelled: the client disconnected mid-stream
                self.metrics.aborted.labels(endpoint).inc()
                status = "499"
            self.metrics.requests.labels(endpoint, status).inc()
            self.metrics.e2e.observe(time.perf_counter() - t0)


class ClientGone(Exception):
    """The HTTP client disconnected before its answer was complete."""


async def _unless_disconnected(request, awaitable):
    """Await `awaitable` unless the client disconnects first: then cancel it (closing the
    request's stream aborts it in the engine) and raise ClientGone. Call only after the
    body was read, so the next ASGI message can only be the disconnect."""
    task = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        watch.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise ClientGone()
    return task.result()


async def _disconnected(request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def _event(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def build_app(server: Server) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.engine.start()
        try:
            yield
        finally:
            await server.pipeline.close(timeout=1.0)
            await server.engine.stop()

    async def not_found(request, exc):
        return error_response(APIError(404, f"no route {request.method} {request.url.path}",
                                       code="not_found"))

    async def method_not_allowed(request, exc):
        return error_response(APIError(405, f"method {request.method} not allowed on "
                                            f"{request.url.path}", code="method_not_allowed"))

    routes = [
        Route("/health", server.health, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/metrics", server.metrics_endpoint, methods=["GET"]),
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={404: not_found, 405: method_not_allowed})
