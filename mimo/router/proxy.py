"""Forwarding one generation request: pick, send, retry before the first byte, pass through.

A request is retried on the next choice (the failed worker excluded and marked down) while
nothing has reached the client: a non-streamed request whenever its worker fails (the router
holds the whole answer until it arrives), a streamed one until the worker's first chunk.
A Responses create goes to the worker that made its `previous_response_id` while it is
healthy (the ids the replicas relayed: `Router.served_by`), else as any request; its own id is
noted from the answer (or the stream's `response.created` event).
Once a stream is under way, a deterministic completion or chat completion (resume.py says
which) is re-issued to another worker and continued where the client is (`_resume`); any
other stream, or one whose regenerated content differs or that finds no worker left, ends
with one SSE error event in the shape the workers use (`{"error": {...}}`), and no [DONE].
Worker answers that are not 200 (a 400 for a bad body, a 503 when it is full) are passed through as they are.
"""
from __future__ import annotations

import json
import logging
import time

import httpx
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response, StreamingResponse

from .resume import Events, Mismatch, Replay, Track, resumable
from .router import Decision, NoWorker, Router, session_of

log = logging.getLogger("mimo.router")

WORKER_HEADER = "x-mimo-worker"     # which worker answered (clients may log it)
PREDICTED_HEADER = "x-mimo-predicted-cached-tokens"   # what the router expected it to reuse
PREFILL_HEADER = "x-mimo-prefill"   # PD: the prefill worker the decode worker takes KV from
PASS_HEADERS = ("authorization", "content-type", "accept", "openai-organization",
                "openai-project", "x-request-id")


def error_json(status: int, message: str, type_: str, code: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": None,
                                   "code": code}}, status_code=status)


def _sse_error(message: str) -> bytes:
    body = {"error": {"message": message, "type": "server_error", "param": None,
                      "code": "worker_failed"}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _cached_tokens(usage) -> int | None:
    if not isinstance(usage, dict):
        return None
    d = usage.get("prompt_tokens_details")
    return d.get("cached_tokens") if isinstance(d, dict) else None


class Forwarder:
    def __init__(self, router: Router):
        self.r = router

    def _account(self, d: Decision, status: int, cached: int | None) -> None:
        m = self.r.metrics
        m.requests.labels(d.url, str(status)).inc()
        m.prompt.labels(d.url).inc(d.prompt_len)
        m.predicted.labels(d.url).inc(d.predicted)
        m.credited.labels(d.url).inc(d.credited)
        for tier, n in zip(("l1", "l2", "l3"), d.tiers):
            if n:
                m.tier_predicted.labels(d.url, tier).inc(n)
        if cached is not None:
            m.actual.labels(d.url).inc(cached)
            m.measured_predicted.labels(d.url).inc(d.predicted)

    async def forward(self, request, kind: str, path: str) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        stream = isinstance(body, dict) and bool(body.get("stream"))
        headers = {k: v for k, v in request.headers.items() if k.lower() in PASS_HEADERS}
        t0 = time.perf_counter()
        prompt = await self.r.tokenize(kind, body)
        session = session_of(body)
        prefer = (await self.r.served_by(body.get("previous_response_id"))
                  if kind == "responses" and isinstance(body, dict) else None)
        tried: set[str] = set()
        for _ in range(self.r.cfg.retries + 1):
            try:
                d = await self.r.route(prompt, frozenset(tried), session, prefer)
            except NoWorker:
                break
            if not tried:
                self.r.metrics.decision.observe(time.perf_counter() - t0)
            tried.add(d.url)
            done = Done(self.r, d)
            try:
                req = self.r.http.build_request(
                    "POST", d.url + path, content=raw,
                    headers={**headers, PREFILL_HEADER: d.prefill} if d.prefill else headers)
                resp = await self.r.http.send(req, stream=True)
                done.resp = resp
                if not stream or resp.status_code != 200:
                    data = await resp.aread()
                    self._account(d, resp.status_code, self._usage_of(data))
                    if kind == "responses" and resp.status_code == 200:
                        self._note(d, _whole_id(data))
                    return Response(data, resp.status_code, headers=self._headers(d),
                                    media_type=resp.headers.get("content-type",
                                                                "application/json"))
                it = resp.aiter_raw()
                try:
                    first = await it.__anext__()
                except StopAsyncIteration:
                    first = b""
                again = (_Again(path, raw, headers, prompt, session, tried)
                         if resumable(kind, body) else None)
                relay = self._relay(d, done, it, first, kind == "responses", again)
                done.streaming = True     # the stream's end finishes it from here
                return StreamingResponse(relay, media_type="text/event-stream",
                                         headers=self._headers(d),
                                         background=BackgroundTask(done.finish))
            except (httpx.TransportError, httpx.StreamError) as e:
                if isinstance(e, httpx.ReadTimeout):
                    self._account(d, 504, None)
                    return error_json(504, f"worker {d.url} did not answer in time",
                                      "server_error", "worker_timeout")
                log.warning("worker %s failed before answering (%r): retrying", d.url, e)
                self.r.mark_down(d.url)
                self.r.metrics.retries.labels(d.url).inc()
            finally:
                if not done.streaming:
                    await done.finish()
        return error_json(503, "no worker could take the request", "server_error",
                          "no_worker")

    @staticmethod
    def _headers(d: Decision) -> dict[str, str]:
        out = {WORKER_HEADER: d.url, PREDICTED_HEADER: str(d.predicted)}
        if d.prefill:
            out[PREFILL_HEADER] = d.prefill
        return out

    @staticmethod
    def _usage_of(data: bytes) -> int | None:
        try:
            return _cached_tokens(json.loads(data).get("usage"))
        except (ValueError, AttributeError):
            return None

    def _note(self, d: Decision, rid: str | None) -> None:
        if rid is not None:
            self.r.note_served(rid, d.url)

    async def _relay(self, d: Decision, done: Done, it, first: bytes, responses: bool = False,
                     again: _Again | None = None):
        cached = None
        status = 200
        track, events = (Track(), Events()) if again is not None else (None, None)
        try:
            chunk = first
            while True:
                if chunk:
                    if cached is None and b'"cached_tokens"' in chunk:
                        cached = _stream_usage(chunk)
                    if responses and b'"response.created"' in chunk:
                        self._note(d, _created_id(chunk))
                        responses = False
                    if track is None or events is None:
                        yield chunk
                    else:
                        for ev in events.feed(chunk):   # whole events: a resume continues them
                            track.note(ev)
                            yield ev
                chunk = await it.__anext__()
        except StopAsyncIteration:
            pass
        except (httpx.TransportError, httpx.StreamError) as e:
            status = 502
            self.r.mark_down(d.url)
            self.r.metrics.stream_errors.labels(d.url).inc()
            log.warning("worker %s broke a stream under way: %r", d.url, e)
            if again is None or track is None:
                yield _sse_error(f"the worker serving this stream failed: {type(e).__name__}")
            else:
                self._account(d, status, cached)
                status = 0
                await done.finish()
                async for ev in self._resume(again, track):
                    yield ev
        finally:
            if status:
                self._account(d, status, cached)
            await done.finish()

    async def _resume(self, a: _Again, track: Track):
        """Re-issue a broken deterministic stream to other workers (the failed ones excluded)
        and send on what the client lacks; one SSE error when none can."""
        why = "no other worker could continue it"
        for _ in range(self.r.cfg.retries + 1):
            try:
                d = await self.r.route(a.prompt, frozenset(a.tried), a.session, None)
            except NoWorker:
                break
            a.tried.add(d.url)
            done, status, replay = Done(self.r, d), 200, Replay(track)
            try:
                h = {**a.headers, PREFILL_HEADER: d.prefill} if d.prefill else a.headers
                resp = await self.r.http.send(
                    self.r.http.build_request("POST", d.url + a.path, content=a.raw, headers=h),
                    stream=True)
                done.resp = resp
                if resp.status_code != 200:
                    status = resp.status_code
                    why = f"worker {d.url} answered {status}"
                    break
                async for chunk in resp.aiter_raw():
                    for ev in replay.feed(chunk):
                        yield ev
                self.r.metrics.resumed.labels(d.url).inc()
                log.info("stream resumed on worker %s", d.url)
                return
            except Mismatch as e:
                status, why = 502, f"its regenerated content differs ({e})"
                break
            except (httpx.TransportError, httpx.StreamError) as e:
                status = 502
                log.warning("worker %s failed resuming a stream (%r)", d.url, e)
                self.r.mark_down(d.url)
                self.r.metrics.stream_errors.labels(d.url).inc()
            finally:
                self._account(d, status, None)
                await done.finish()
        yield _sse_error(f"the worker serving this stream failed and {why}")


class _Again:
    """What re-issuing a streamed request takes."""
    def __init__(self, path: str, raw: bytes, headers: dict[str, str], prompt, session,
                 tried: set[str]):
        self.path, self.raw, self.headers = path, raw, headers
        self.prompt, self.session, self.tried = prompt, session, tried


class Done:
    """Ends a forwarded request exactly once (the stream's end, its background task or a
    failed attempt): closes the worker's response and takes it out of the in-flight count."""
    def __init__(self, router: Router, d: Decision):
        self.r, self.d = router, d
        self.resp: httpx.Response | None = None
        self.streaming = False
        self._done = False

    async def finish(self) -> None:
        if self._done:
            return
        self._done = True
        if self.resp is not None:
            await self.resp.aclose()
        await self.r.end(self.d)


def _whole_id(data: bytes) -> str | None:
    """A Response object's id."""
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    rid = obj.get("id") if isinstance(obj, dict) and obj.get("object") == "response" else None
    return rid if isinstance(rid, str) else None


def _created_id(chunk: bytes) -> str | None:
    """The response id in a stream's `response.created` event (the stream's first)."""
    for line in chunk.split(b"\n"):
        if line.startswith(b"data: {") and b'"response.created"' in line:
            try:
                ev = json.loads(line[6:])
            except ValueError:
                return None
            rid = (ev.get("response") or {}).get("id") if isinstance(ev, dict) else None
            return rid if isinstance(rid, str) else None
    return None


def _stream_usage(chunk: bytes) -> int | None:
    for line in chunk.split(b"\n"):
        if line.startswith(b"data: {") and b'"cached_tokens"' in line:
            try:
                return _cached_tokens(json.loads(line[6:]).get("usage"))
            except ValueError:
                return None
    return None
