"""api/errors.py, the one place errors become HTTP: a typed client fault raised inside a stage
is a 400 (whatever stage), an unexpected exception in a stage is a 500 whose traceback is
logged and whose message says nothing of it, and client messages carry no stage tags."""
from __future__ import annotations

import asyncio
import logging

import httpx

from mimo.api import errors
from mimo.api.app import Server, build_app
from mimo.api.errors import to_api_error
from mimo.config import ServerConfig
from mimo.engine.async_engine import AsyncEngine
from mimo.engine.engine import LLMEngine, RequestError
from mimo.llm import engine_config
from mimo.multimodal.errors import MediaForbidden
from mimo.multimodal.placeholders import PlaceholderMismatch
from mimo.pipeline import InvalidRequest, Overloaded, StageError
from mimo.stages.prompt import BuildPrompt


def test_typed_http_faults_get_their_status_here():
    """The HTTP layer raises its faults by name; errors.py alone gives them status, code and
    param (model-not-found once, not at each endpoint)."""
    want = {errors.ModelNotFound(5, "m"): (404, "model_not_found", "model", "an integer"),
            errors.ModelNotFound("gpt-4o", "m"): (404, "model_not_found", "model", "'gpt-4o'"),
            errors.Unauthorized(): (401, "invalid_api_key", None, "api key"),
            errors.BodyTooLarge(1024): (413, "request_too_large", None, "1024"),
            errors.BodyTimeout(2.5): (408, "request_timeout", None, "2.5 s"),
            errors.BodyIncomplete(): (400, None, None, "disconnected"),
            errors.RouteNotFound("GET", "/x"): (404, "not_found", None, "/x"),
            errors.MethodNotAllowed("PUT", "/v1/models"): (405, "method_not_allowed", None, "PUT"),
            errors.InvalidSchema("tools", "bad type"): (400, "invalid_schema", "tools", "bad type")}
    for exc, (status, code, param, says) in want.items():
        err = to_api_error(exc)
        assert (err.status, err.code, err.param) == (status, code, param), exc
        assert says.lower() in err.message.lower(), (exc, err.message)
    assert to_api_error(errors.Unauthorized()).type == "authentication_error"


def test_stage_errors_map_by_their_typed_cause():
    media = to_api_error(StageError("fetch", MediaForbidden("image 1 of 1: private address")))
    assert (media.status, media.code, media.param) == (400, "invalid_media", "messages")
    assert media.message == "image 1 of 1: private address"
    for cause in (RequestError("prompt has 9000 tokens"), PlaceholderMismatch("2 for 1")):
        err = to_api_error(StageError("generate", cause))
        assert err.status == 400 and err.message == str(cause)
    for bug in (ValueError("an index went wrong"), TypeError("bad operand"), KeyError("k")):
        err = to_api_error(StageError("prompt", bug))
        assert err.status == 500 and err.type == "server_error"
        assert "went wrong" not in err.message and "operand" not in err.message


def test_client_messages_carry_no_object_reprs_and_context_errors_agree():
    from mimo.multimodal.errors import MediaError
    from mimo.stages import ContextLengthExceeded
    err = to_api_error(StageError("decode_media", MediaError(
        "[decode_media] cannot identify image file <_io.BytesIO object at 0x7f3a2c1b9e40>")))
    assert err.message == "cannot identify image file the data"
    prompt = to_api_error(StageError("generate", ContextLengthExceeded("too long", "prompt")))
    chat = to_api_error(ContextLengthExceeded("too long", "messages"))
    assert (prompt.param, prompt.code) == ("prompt", "context_length_exceeded")
    assert (chat.param, chat.code) == ("messages", "context_length_exceeded")


def test_client_messages_carry_no_stage_tag():
    bad = InvalidRequest("this model takes no video parts", stage="prompt")
    assert str(bad).startswith("[prompt] ")              # logs keep the tag
    assert to_api_error(bad).message == "this model takes no video parts"
    busy = to_api_error(Overloaded("no slot within 1s", stage="encode"))
    assert busy.status == 503 and busy.message == "no slot within 1s"


def test_a_bug_inside_a_stage_is_a_500_with_its_traceback_logged(tiny_hf_dir, monkeypatch,
                                                                caplog):
    """A ValueError raised by a bug in a stage (here the prompt builder) used to reach the
    client as a 400; it is the server's fault."""
    def broken(self, req):
        raise ValueError("bug: an index went wrong")
    monkeypatch.setattr(BuildPrompt, "tokenize", broken)
    body = {"model": "tiny", "prompt": "hello world", "max_tokens": 2}

    async def main():
        eng = LLMEngine(engine_config(str(tiny_hf_dir[0]), dtype="float32",
                                      kv_cache_memory="4MiB"), progress=False)
        ae = AsyncEngine(eng)
        server = Server(ServerConfig(), ae, "tiny")
        ae.start()
        try:
            transport = httpx.ASGITransport(app=build_app(server))
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
                r = await c.post("/v1/completions", json=body)
                s = await c.post("/v1/completions", json=body | {"stream": True})
                return r, s
        finally:
            await server.pipeline.close()
            await ae.stop()
    with caplog.at_level(logging.ERROR, logger="mimo.api"):
        r, s = asyncio.run(main())
    assert r.status_code == 500 and s.status_code == 500
    err = r.json()["error"]
    assert err["type"] == "server_error" and "index" not in err["message"]
    logged = [rec for rec in caplog.records if rec.name == "mimo.api"]
    assert len(logged) == 2 and "stage 'prompt'" in logged[0].getMessage()
    assert logged[0].exc_info[0] is ValueError and "an index went wrong" in caplog.text
    assert "Traceback" in caplog.text and "in broken" in caplog.text
