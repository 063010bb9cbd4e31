"""Every error a client can see, mapped to HTTP in exactly this one place.

Bodies use OpenAI's error shape: {"error": {"message", "type", "param", "code"}}.
"""
from __future__ import annotations

from starlette.responses import JSONResponse

from ..config import ConfigError
from ..engine.engine import EngineStopped, RequestError
from ..multimodal.errors import MediaError
from ..models.chat_template import ChatTemplateError
from ..pipeline.errors import (InvalidRequest, Overloaded, PipelineClosed, PipelineError,
                               RequestCancelled, StageError)


class APIError(Exception):
    """An error with its HTTP status and OpenAI error type."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def to_api_error(e: BaseException) -> APIError:
    if isinstance(e, APIError):
        return e
    if isinstance(e, StageError):
        cause = e.__cause__ or getattr(e, "cause", None)
        if cause is not None and not isinstance(cause, StageError):
            inner = to_api_error(cause)
            if inner.status != 500:     # the client's fault, or a known server state
                return inner
        return APIError(500, "internal error while processing the request", "server_error")
    if isinstance(e, MediaError):       # bad URL, bytes or size: the client's media
        return bad_request(str(e), "messages", "invalid_media")
    if isinstance(e, (RequestError, ChatTemplateError, InvalidRequest, ConfigError, ValueError,
                      TypeError)):
        return bad_request(str(e))
    if isinstance(e, EngineStopped):
        return APIError(503, "the engine stopped after an internal error; the server is "
                             "shutting down", "server_error", code="engine_stopped")
    if isinstance(e, (Overloaded, PipelineClosed)):
        return APIError(503, str(e) or "server overloaded, retry later", "server_error",
                        code="overloaded")
    if isinstance(e, RequestCancelled):
        return APIError(499, "request cancelled", "invalid_request_error", code="cancelled")
    if isinstance(e, PipelineError):
        return APIError(500, str(e), "server_error")
    return APIError(500, "internal server error", "server_error")


def error_body(err: APIError) -> dict:
    return {"error": {"message": err.message, "type": err.type, "param": err.param,
                      "code": err.code}}


def error_response(e: BaseException) -> JSONResponse:
    err = to_api_error(e)
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(error_body(err), status_code=err.status, headers=headers)
