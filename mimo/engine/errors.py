"""The engine's exceptions: what a caller of the engine's face catches (api/errors.py maps
them to HTTP)."""
from __future__ import annotations

from typing import Any


class RequestError(ValueError):
    """A request that can never be served as given (empty, too long, ...)."""


class StepFailed(RuntimeError):
    """An engine step raised; the requests it touched (`failed`) were finished with
    reason 'error' and their KV freed. The engine goes on."""
    def __init__(self, cause: BaseException, failed: list[Any]) -> None:
        super().__init__(f"engine step failed: {cause!r}")
        self.cause, self.failed = cause, failed


class EngineBroken(RuntimeError):
    """The pools or the prefix cache are inconsistent: the engine must stop."""


class EngineStopped(RuntimeError):
    """A request was submitted after the engine stopped (see `AsyncEngine.fatal`)."""
