"""Running a parsed request's samples and answering with them, whole or streamed (SSE).

n > 1 (or best_of): one pipeline request per sample. The first is started alone and the
others once its first token is out, when its prompt KV is in the prefix cache, so they
reuse it (their usage reports it as cached). best_of > n keeps the n samples of highest
mean token logprob. Usage: the prompt counted once, completion tokens summed, cached
tokens the most any sample reused.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..config.peers import peer_allowed
from ..stages import ChatRequest
from ..tools import OutputParser
from .chat_pipeline import chat_request
from .choice import Choice
from .errors import APIError, error_body, error_response, to_api_error
from .response_format import closed
from .schemas import GenerationSpec

# A decode worker's request: the prefill worker the router chose (mimo/disagg).
PREFILL_HEADER = "x-mimo-prefill"


class ClientGone(Exception):
    """The HTTP client disconnected before its answer was complete."""


@dataclass
class Run:
    req: ChatRequest
    stream: AsyncGenerator[Any, None]   # the pipeline's stream of TextDelta
    first: object               # its first item (None: it ended with nothing)
    t0: float = 0.0             # when the request was started (perf_counter)


class Responder:
    def __init__(self, server):
        self.s = server

    # ---- starting -----------------------------------------------------------------------
    async def start(self, request, spec: GenerationSpec) -> list[Run]:
        """Start every sample; errors before any first token are raised (-> HTTP)."""
        fmt = self.s.tool_format
        tools_on = spec.tools is not None and spec.tools.active
        keep = spec.kind == "chat" and (tools_on or fmt.reasoning is not None)
        reqs = [chat_request(spec, i, keep) for i in range(spec.choices.best_of)]
        prefill = request.headers.get(PREFILL_HEADER) if self.s.cfg.role == "decode" else None
        if prefill is not None and not peer_allowed(prefill, self.s.cfg.prefill_peers):
            raise APIError(403, f"{PREFILL_HEADER} names {prefill[:200]!r}, not a prefill "
                                "worker this decode worker may take KV from (--prefill-peer)",
                           "permission_error", None, "prefill_peer_not_allowed")
        for r in reqs:
            r.prefill_url = prefill
        runs: list[Run] = []
        t0 = time.perf_counter()
        try:
            runs.append(await self._first(request, reqs[0]))
            runs[0].t0 = t0
            self.s.metrics.ttft.observe(time.perf_counter() - t0)
            if len(reqs) > 1:
                rest = await unless_disconnected(request, asyncio.gather(
                    *(self._first(None, r) for r in reqs[1:]), return_exceptions=True))
                runs += [r for r in rest if isinstance(r, Run)]
                bad = [r for r in rest if not isinstance(r, Run)]
                if bad:
                    raise bad[0]
        except BaseException:
            for run in runs:
                await run.stream.aclose()
            raise
        return runs

    async def _first(self, request, req: ChatRequest) -> Run:
        # On its way to the engine until `generate` submits it (engine/arrivals.py).
        req.arrival = self.s.engine.arriving()
        stream = self.s.pipeline.stream(req)
        try:
            aw = anext(stream, None)
            first = await (unless_disconnected(request, aw) if request is not None else aw)
        except BaseException:
            await stream.aclose()
            raise
        finally:        # one that never reached `submit` (refused, failed, cancelled)
            if req.arrival is not None:
                req.arrival.close()
        return Run(req, stream, first)

    def _choices(self, spec: GenerationSpec, n: int) -> list[Choice]:
        tools = spec.tools
        out = []
        for i in range(n):
            parser = None
            if spec.kind == "chat":
                decl = tools.tools if tools else ()
                parser = OutputParser(self.s.tool_format, tools is not None and tools.active,
                                      True, {t.name: t.parameters for t in decl},
                                      {t.name: closed(t.parameters) for t in decl if t.strict})
            out.append(Choice(i, spec, self.s.tokenizer, parser))
        return out

    # ---- accounting ---------------------------------------------------------------------
    def abandoned(self, endpoint: str) -> Response:
        """The client went away before its answer was complete: counted as such (never as a
        200); the response goes nowhere."""
        self.s.metrics.aborted.labels(endpoint).inc()
        self.s.metrics.requests.labels(endpoint, "499").inc()
        return Response(status_code=499)

    def _account(self, req: ChatRequest) -> None:
        m, u = self.s.metrics, req.usage
        m.prompt_tokens.inc(u.prompt_tokens)
        m.generation_tokens.inc(u.completion_tokens)
        m.cached_tokens.inc(u.cached_tokens)
        if req.cache.session is not None:
            m.sessions.observe(req.cache.session, u.prompt_tokens, u.cached_tokens)
        if req.engine_queue_wait is not None:
            m.observe_queue_wait(req.engine_queue_wait)

    def pause(self, req: ChatRequest) -> None:
        """The answer ended in a tool call: the session waits for the tool's result, so the
        engine keeps what it cached after everything else for a while."""
        if req.engine_stream is not None:
            self.s.engine.hold(req.engine_stream)

    def _pause_tool_calls(self, runs: list[Run], choices: list[Choice]) -> None:
        for r, ch in zip(runs, choices):
            if ch.finish_reason in ("tool_calls", "function_call"):
                self.pause(r.req)

    @staticmethod
    def _usage(runs: list[Run]) -> dict:
        us = [r.req.usage for r in runs]
        p, c = us[0].prompt_tokens, sum(u.completion_tokens for u in us)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                "prompt_tokens_details": {"cached_tokens": max(u.cached_tokens for u in us)}}

    def _head(self, kind: str, obj: str) -> dict:
        return {"id": ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24],
                "object": obj, "created": int(time.time()), "model": self.s.model_name,
                "system_fingerprint": self.s.fingerprint}

    def _echo(self, spec: GenerationSpec, run: Run) -> str:
        if not spec.echo:
            return ""
        return spec.prompt if spec.prompt is not None else self.s.tokenizer.decode(
            run.req.prompt_ids)

    # ---- whole --------------------------------------------------------------------------
    async def whole(self, kind: str, spec: GenerationSpec, runs: list[Run]):
        endpoint = "chat" if kind == "chat" else "completions"
        choices = self._choices(spec, len(runs))

        async def collect(run: Run, ch: Choice):
            item = run.first
            try:
                while item is not None:
                    ch.feed(item)
                    item = await anext(run.stream, None)
            finally:
                await run.stream.aclose()
        try:
            await asyncio.gather(*(collect(r, c) for r, c in zip(runs, choices)))
        except Exception as e:  # noqa: BLE001
            for r in runs:
                with contextlib.suppress(Exception):
                    await r.stream.aclose()
            resp = error_response(e)
            self.s.metrics.requests.labels(endpoint, str(resp.status_code)).inc()
            return resp
        self.s.metrics.e2e.observe(time.perf_counter() - runs[0].t0)
        self.s.metrics.requests.labels(endpoint, "200").inc()
        for r in runs:
            self._account(r.req)
        self._pause_tool_calls(runs, choices)
        order = list(range(len(runs)))
        if spec.choices.best_of > spec.n:
            order = sorted(order, key=lambda i: -choices[i].mean_logprob)[:spec.n]
        body = self._head(kind, "chat.completion" if kind == "chat" else "text_completion")
        out = []
        for k, i in enumerate(order):
            ch = choices[i]
            ch.index = k
            out.append(ch.chat_choice() if kind == "chat"
                       else ch.completion_choice(self._echo(spec, runs[i])))
        body.update(choices=out, usage=self._usage(runs))
        return JSONResponse(body)

    # ---- streamed -----------------------------------------------------------------------
    def stream(self, kind: str, spec: GenerationSpec, runs: list[Run]) -> StreamingResponse:
        return StreamingResponse(self._sse(kind, spec, runs), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def _sse(self, kind: str, spec: GenerationSpec, runs: list[Run]):
        endpoint = "chat" if kind == "chat" else "completions"
        head = self._head(kind, "chat.completion.chunk" if kind == "chat" else "text_completion")
        choices = self._choices(spec, len(runs))
        usage_null = {"usage": None} if spec.include_usage else {}

        def event(choice: dict) -> bytes:
            return _event({**head, "choices": [choice], **usage_null})

        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, run: Run):
            item = run.first
            try:
                while item is not None:
                    await queue.put((i, item))
                    item = await anext(run.stream, None)
                await queue.put((i, None))
            except Exception as e:  # noqa: BLE001 - reported in-band by the consumer
                await queue.put((i, e))

        status = None           # set once the answer is complete or failed
        last = time.perf_counter()
        tasks = [asyncio.ensure_future(pump(i, r)) for i, r in enumerate(runs)]
        try:
            for i, run in enumerate(runs):
                if kind == "chat":
                    yield event({"index": i, "delta": {"role": "assistant", "content": ""},
                                 "finish_reason": None, "logprobs": None})
                elif spec.echo:
                    yield event({"index": i, "text": self._echo(spec, run),
                                 "finish_reason": None, "logprobs": None})
            live = len(runs)
            while live:
                i, item = await queue.get()
                if item is None:
                    live -= 1
                    continue
                if isinstance(item, Exception):
                    raise item
                now = time.perf_counter()
                self.s.metrics.itl.observe(now - last)
                last = now
                choice = _chunk_choice(kind, spec, choices[i], i, item)
                if choice is not None:
                    yield event(choice)
            if spec.include_usage:
                yield _event({**head, "choices": [], "usage": self._usage(runs)})
            status = "200"
            self._pause_tool_calls(runs, choices)
            yield b"data: [DONE]\n\n"
        except Exception as e:  # noqa: BLE001 - headers are out: report in-band, then end
            err = to_api_error(e)
            status = str(err.status)
            yield _event(error_body(err))
        finally:
            for t in tasks:
                t.cancel()
            # A client leaving mid-stream cancels the response's scope, which cancels every
            # await in it again: unshielded, the first await here would end this block and
            # the request would be counted nowhere.
            with anyio.CancelScope(shield=True):
                await asyncio.gather(*tasks, return_exceptions=True)
                for r in runs:
                    with contextlib.suppress(Exception):
                        await r.stream.aclose()
            for r in runs:
                self._account(r.req)
            if status is None:      # cancelled: the client disconnected mid-stream
                self.s.metrics.aborted.labels(endpoint).inc()
                status = "499"
            self.s.metrics.requests.labels(endpoint, status).inc()
            self.s.metrics.e2e.observe(time.perf_counter() - runs[0].t0)


def _chunk_choice(kind: str, spec: GenerationSpec, ch, i: int, item) -> dict | None:
    """The stream chunk's choice for one engine output of choice i; None when it says nothing."""
    events = ch.feed(item)
    lps = item.logprobs if spec.choices.logprobs is not None else []
    if kind == "chat":
        delta = ch.chat_delta(events)
        finish = ch.finish_reason if item.finish_reason else None
        if delta or finish or lps:
            return {"index": i, "delta": delta, "finish_reason": finish,
                    "logprobs": ch.chat_logprobs(lps) if lps else None}
        return None
    if item.text or item.finish_reason or lps:
        return {"index": i, "text": item.text, "finish_reason": item.finish_reason,
                "logprobs": ch.completion_logprobs(lps) if lps else None}
    return None


async def unless_disconnected(request, awaitable):
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


def _event(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"
