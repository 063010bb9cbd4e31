"""Arrivals: requests on their way to the engine (admitted by the server, still being
parsed, templated or tokenized), so that an idle engine can wait for the rest of a burst.

Why: a burst of requests reaches the engine over a few milliseconds (each is tokenized on
the server's threads first), and an idle engine plans its first step at the first arrival.
That step takes only what has arrived (4 of 16 prompts in a measured burst), and the rest
then wait a whole step (0.27 s here) to start. When nothing runs, waiting a few more
milliseconds for requests already on their way costs no running request anything.

Ownership: the event loop opens and closes arrivals; the engine thread reads `pending`.
Every opened arrival is closed exactly once (`close` is idempotent): when its request is in
the engine's inbox, or when it fails or goes elsewhere before.
"""
from __future__ import annotations

import threading
from collections.abc import Callable


class Arrival:
    """One request on its way; `close()` when it is queued (or never will be)."""

    def __init__(self, owner: Arrivals):
        self._owner: Arrivals | None = owner

    def close(self) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:
            owner._closed()


class Arrivals:
    def __init__(self, on_close: Callable[[], None] = lambda: None):
        self._lock = threading.Lock()
        self._n = 0
        self._on_close = on_close     # wakes a waiting engine (its count may now be 0)

    def open(self) -> Arrival:
        with self._lock:
            self._n += 1
        return Arrival(self)

    @property
    def pending(self) -> int:
        with self._lock:
            return self._n

    def _closed(self) -> None:
        with self._lock:
            assert self._n > 0, "an arrival closed twice"
            self._n -= 1
        self._on_close()
