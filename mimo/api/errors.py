"""Every error a client can see, mapped to HTTP in exactly this one place.

Stages do not translate errors: a typed client fault raised inside one (bad media, a prompt
the engine refuses, a template that cannot render, placeholders typed in the text) reaches
here as the `cause` of the pipeline's `StageError` and becomes a 400. Any other exception a
stage raises is a bug or a server fault: a 500 with a generic message, its traceback logged
here. Client messages never carry the pipeline's stage tags.

Bodies use OpenAI's error shape: {"error": {"message", "type", "param", "code"}}.
"""
from __future__ import annotations

import logging
import re

from starlette.responses import JSONResponse

from ..engine.errors import EngineStopped, RequestError
from ..models.chat_template import ChatTemplateError
from ..multimodal.errors import EncoderUnavailable, MediaError
from ..multimodal.placeholders import PlaceholderMismatch
from ..pipeline.errors import (
    InvalidRequest,
    Overloaded,
    PipelineClosed,
    PipelineError,
    RequestCancelled,
    StageError,
)

log = logging.getLogger("mimo.api")

# The client's faults, by type: each is raised for bad input only, never for a bug.
CLIENT_FAULTS: tuple[type[BaseException], ...] = (
    MediaError, RequestError, ChatTemplateError, PlaceholderMismatch, InvalidRequest)


class APIError(Exception):
    """An error with its HTTP status and OpenAI error type."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


# ---- typed faults of the HTTP layer: raised by name, given their status only here --------
class ModelNotFound(Exception):
    """The body (or path) names a model this server does not serve."""

    def __init__(self, model: object, served: str):
        super().__init__(f"model {model!r} does not exist")
        self.model, self.served = model, served


class Unauthorized(Exception):
    """No or a wrong API key; `where`: what needed it, for the message."""

    def __init__(self, where: str = ""):
        super().__init__("missing or invalid API key")
        self.where = where


class BodyTooLarge(Exception):
    def __init__(self, limit: int):
        super().__init__(f"request body over {limit} bytes")
        self.limit = limit


class BodyTimeout(Exception):
    """The client did not send its whole body within the read deadline."""

    def __init__(self, seconds: float):
        super().__init__(f"request body not received within {seconds:g} s")
        self.seconds = seconds


class BodyIncomplete(Exception):
    """The client disconnected while sending its body."""


class RouteNotFound(Exception):
    def __init__(self, method: str, path: str):
        super().__init__(f"no route {method} {path}")
        self.method, self.path = method, path


class MethodNotAllowed(Exception):
    def __init__(self, method: str, path: str):
        super().__init__(f"method {method} not allowed on {path}")
        self.method, self.path = method, path


class InvalidSchema(Exception):
    """A JSON schema (of `param`: response_format or tools) the grammar compiler refused."""

    def __init__(self, param: str, detail: str):
        super().__init__(detail)
        self.param, self.detail = param, detail


def _http_fault(e: BaseException) -> APIError | None:
    """The typed faults above -> their HTTP errors (None: not one of them)."""
    if isinstance(e, ModelNotFound):
        shown = e.model if isinstance(e.model, str) else _kind(e.model)
        return APIError(404, f"model {shown!r} does not exist; this server serves "
                             f"{e.served!r}", code="model_not_found", param="model")
    if isinstance(e, Unauthorized):
        return APIError(401, f"missing or invalid API key ({e.where or 'Authorization: Bearer ...'})",
                        "authentication_error", code="invalid_api_key")
    if isinstance(e, BodyTooLarge):
        return APIError(413, str(e), code="request_too_large")
    if isinstance(e, BodyTimeout):
        return APIError(408, str(e), code="request_timeout")
    if isinstance(e, BodyIncomplete):
        return APIError(400, "client disconnected while sending the body")
    if isinstance(e, RouteNotFound):
        return APIError(404, str(e), code="not_found")
    if isinstance(e, MethodNotAllowed):
        return APIError(405, str(e), code="method_not_allowed")
    if isinstance(e, InvalidSchema):
        return bad_request(clean(f"'{e.param}': {e.detail}"), e.param, "invalid_schema")
    return None


def _kind(v: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", list: "an array",
            dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")
_TAG = re.compile(r"^(\[[\w-]+\] )+")


def clean(message: str) -> str:
    """A message fit for a client: no pipeline stage tags, no object reprs (a library's
    error text may name its own objects: 'cannot identify image file <_io.BytesIO ...>')."""
    return _REPR.sub("the data", _TAG.sub("", message)).strip() or "invalid request"


def _client_fault(e: BaseException) -> APIError:
    if isinstance(e, MediaError):       # bad URL, bytes or size: the client's media
        return bad_request(clean(str(e)), "messages", "invalid_media")
    if isinstance(e, ChatTemplateError):
        return bad_request(clean(str(e)), "messages", "invalid_messages")
    if isinstance(e, RequestError):     # the engine refused the prompt as given
        return bad_request(clean(str(e)), "prompt", "invalid_prompt")
    msg = e.message if isinstance(e, PipelineError) else str(e)
    return bad_request(clean(msg), getattr(e, "param", None), getattr(e, "code", None))


def _internal(e: BaseException, where: str | None) -> APIError:
    log.error("request failed%s", f" in stage {where!r}" if where else "",
              exc_info=(type(e), e, e.__traceback__))
    return APIError(500, "internal error while processing the request", "server_error")


def to_api_error(e: BaseException) -> APIError:
    if isinstance(e, APIError):
        e.message = clean(e.message)
        return e
    http = _http_fault(e)
    if http is not None:
        return http
    if isinstance(e, StageError):
        cause = e.cause
        if isinstance(cause, CLIENT_FAULTS):
            return _client_fault(cause)
        if isinstance(cause, (EngineStopped, EncoderUnavailable)):
            return to_api_error(cause)
        return _internal(cause, e.stage)
    if isinstance(e, CLIENT_FAULTS):
        return _client_fault(e)
    if isinstance(e, EngineStopped):
        return APIError(503, "the engine stopped after an internal error; the server is "
                             "shutting down", "server_error", code="engine_stopped")
    if isinstance(e, EncoderUnavailable):
        return APIError(503, f"the media could not be encoded: {e}", "server_error",
                        code="encoder_unavailable")
    if isinstance(e, (Overloaded, PipelineClosed)):
        return APIError(503, e.message or "server overloaded, retry later", "server_error",
                        code="overloaded")
    if isinstance(e, RequestCancelled):
        return APIError(499, "request cancelled", "invalid_request_error", code="cancelled")
    return _internal(e, getattr(e, "stage", None))


def error_body(err: APIError) -> dict:
    return {"error": {"message": err.message, "type": err.type, "param": err.param,
                      "code": err.code}}


def error_response(e: BaseException) -> JSONResponse:
    err = to_api_error(e)
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(error_body(err), status_code=err.status, headers=headers)
