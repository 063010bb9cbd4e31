"""The OpenAI-compatible HTTP app (starlette). Handlers authorize, read the body (body.py),
parse it (schemas.py), compile any grammar, run one pipeline request per sample
(chat_pipeline.py: [media stages] -> prompt -> generate -> detokenize) and hand the streams
to the responder (responder.py), which shapes OpenAI's responses; errors go through
`errors.error_response`, the one place exceptions become HTTP."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..config import ServerConfig
from ..engine.async_engine import AsyncEngine
from ..multimodal.config import MediaConfig
from ..structured import GrammarError, grammar_vocab
from ..tools import format_for
from . import schemas, worker_threads
from .body import read_json
from .chat_pipeline import build_chat_pipeline
from .errors import (
    InvalidSchema,
    MethodNotAllowed,
    ModelNotFound,
    RouteNotFound,
    Unauthorized,
    bad_request,
    error_response,
)
from .metrics import Metrics
from .responder import ClientGone, Responder, Run, unless_disconnected
from .responses import ResponsesAPI, open_store
from .tokenize import detokenize, tokenize
from .web_ui import web_ui_routes

if TYPE_CHECKING:
    from ..pipeline import Stage


class Server:
    def __init__(self, cfg: ServerConfig, engine: AsyncEngine, model_name: str,
                 media: MediaConfig | None = None, generate: Stage | None = None):
        """`generate`: the pipeline's generate stage (default `Generate(engine)`; a decode
        worker's takes prompt KV from a prefill worker, mimo/disagg)."""
        self.cfg = cfg
        self.engine = engine
        self.model_name = cfg.served_model_name or model_name
        info = self.info = engine.info
        self.max_model_len = info.max_model_len
        self.tokenizer = info.tokenizer
        self.tool_format = format_for(info.arch)
        self.metrics = Metrics()
        self.chat_pipeline = build_chat_pipeline(cfg, engine, media, generate)
        self.extra_routes: list[Route] = []     # added before build_app (a worker's role)
        self.pipeline = self.chat_pipeline.pipeline
        if self.chat_pipeline.multimodal:
            self.metrics.watch_encoder(self.chat_pipeline.encode)
        self.metrics.watch_engine(lambda: engine.stats)
        # Same model, same numerics, same build: same fingerprint (OpenAI's system_fingerprint).
        self.fingerprint = "fp_" + hashlib.sha256(
            f"{self.model_name}|{info.dtype}|{info.device}|{info.speculative}".encode()
        ).hexdigest()[:12]
        self.responder = Responder(self)
        self.responses = ResponsesAPI(self, open_store(cfg.responses_store, cfg.responses_ttl))
        self.publisher = None       # cache state for the router
        if cfg.router_redis:
            self.publisher = engine.publisher(cfg.router_redis, cfg.advertise_url or
                                              f"http://{cfg.host}:{cfg.port}",
                                              cfg.router_heartbeat, 6 * cfg.router_heartbeat)

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

    def _require_key(self, request) -> None:
        if not self._authorized(request):
            raise Unauthorized()

    async def _body(self, request) -> object:
        self._require_key(request)
        return await read_json(request, self.cfg.max_body_bytes, self.cfg.body_read_timeout)

    def _model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": 0, "owned_by": "mimo",
                "max_model_len": self.max_model_len}

    # ---- endpoints ------------------------------------------------------------------
    async def health(self, request):
        if self.engine.fatal is not None:
            return JSONResponse({"status": "error", "detail": str(self.engine.fatal)}, 503)
        return JSONResponse({"status": "ok"})

    async def models(self, request):
        try:
            self._require_key(request)
        except Unauthorized as e:
            return error_response(e)
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request):
        try:
            self._require_key(request)
            name = request.path_params["model"]
            if name != self.model_name:
                raise ModelNotFound(name, self.model_name)
        except (Unauthorized, ModelNotFound) as e:
            return error_response(e)
        return JSONResponse(self._model_card())

    async def metrics_endpoint(self, request):
        if not self.cfg.metrics_public and not self._authorized(request):
            return error_response(Unauthorized("/metrics needs it unless --metrics-public"))
        self.metrics.observe_engine(self.engine.stats)
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def tokenize(self, request):
        """vLLM's /tokenize: a prompt or a chat rendered as generation would (tokenize.py)."""
        return await self._token_route(request, tokenize)

    async def detokenize(self, request):
        return await self._token_route(request, detokenize)

    async def _token_route(self, request, handler):
        try:
            body = await self._body(request)
            if not isinstance(body, dict):
                raise bad_request("the request body must be a JSON object")
            self._check_model(body, required=False)
            out = handler(self, body)
            if asyncio.iscoroutine(out):
                out = await out
        except Exception as e:  # noqa: BLE001 - answered in OpenAI's shape
            return error_response(e)
        return JSONResponse(out)

    def _check_model(self, body: dict, required: bool = True) -> None:
        m = body.get("model")
        if m is None and not required:
            return
        if m != self.model_name:
            raise ModelNotFound(m, self.model_name)

    async def chat(self, request):
        return await self._generate(request, "chat")

    async def completions(self, request):
        return await self._generate(request, "completion")

    async def _constraint(self, spec: schemas.GenerationSpec):
        """Compile the spec's grammar (off the loop: the first one builds the vocabulary)."""
        g = spec.grammar
        assert g is not None, "asked only for a spec with a grammar"
        info = self.info
        param = "response_format" if spec.json_mode else "tools"

        def build():
            vocab = grammar_vocab(self.tokenizer, info.vocab_size, info.stop_ids)
            return g.compile(vocab)
        try:
            return await asyncio.to_thread(build)
        except GrammarError as e:
            raise InvalidSchema(param, str(e)) from None

    async def _generate(self, request, kind: str):
        endpoint = "chat" if kind == "chat" else "completions"
        runs: list[Run] = []
        try:
            spec = schemas.parse(kind, await self._body(request), self.max_model_len,
                                 multimodal=self.chat_pipeline.multimodal,
                                 vocab_size=self.info.vocab_size,
                                 tool_format=self.tool_format,
                                 default_max_tokens=self.cfg.default_max_tokens)
            if spec.model != self.model_name:
                raise ModelNotFound(spec.model, self.model_name)
            if spec.grammar is not None:
                spec.params = dataclasses.replace(spec.params,
                                                  constraint=await self._constraint(spec))
            runs = await self.responder.start(request, spec)
        except ClientGone:
            return self.responder.abandoned(endpoint)
        except Exception as e:  # noqa: BLE001 - every failure is answered in OpenAI's shape
            resp = error_response(e)
            self.metrics.requests.labels(endpoint, str(resp.status_code)).inc()
            return resp
        if spec.stream:
            return self.responder.stream(kind, spec, runs)
        try:
            return await unless_disconnected(request, self.responder.whole(kind, spec, runs))
        except ClientGone:          # the streams were closed: the engine aborts them
            return self.responder.abandoned(endpoint)


def build_app(server: Server) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        pool = worker_threads.install(asyncio.get_running_loop())
        server.engine.start()
        if server.publisher is not None:
            server.publisher.start()
        try:
            yield
        finally:
            if server.publisher is not None:
                await server.publisher.stop()
            await server.responses.close()
            await server.pipeline.close(timeout=1.0)
            await server.engine.stop()
            pool.shutdown(wait=False)

    async def not_found(request, exc):
        return error_response(RouteNotFound(request.method, request.url.path))

    async def method_not_allowed(request, exc):
        return error_response(MethodNotAllowed(request.method, request.url.path))

    routes = [
        Route("/health", server.health, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/models/{model:path}", server.model, methods=["GET"]),
        Route("/metrics", server.metrics_endpoint, methods=["GET"]),
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/tokenize", server.tokenize, methods=["POST"]),
        Route("/detokenize", server.detokenize, methods=["POST"]),
        Route("/v1/responses", server.responses.create, methods=["POST"]),
        Route("/v1/responses/{response_id}", server.responses.retrieve, methods=["GET"]),
        Route("/v1/responses/{response_id}", server.responses.delete, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", server.responses.input_items,
              methods=["GET"]),
    ]
    routes += server.extra_routes
    if server.cfg.web_ui:
        routes += web_ui_routes()
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={404: not_found, 405: method_not_allowed})
