"""Serving a built `Server` over HTTP from Python: uvicorn (with uvloop when it is installed)
on the server config's host and port, until interrupted or until the engine stops.

`python server.py` builds its Server from flags and calls `serve`; a program that builds an
`LLMEngine` with its own parts does the same (examples/custom_engine.py).
"""
from __future__ import annotations

import asyncio
import gc
import logging
import sys

from .app import Server, build_app

log = logging.getLogger("mimo")

# After the engine stops, /health answers 503 this long (monitors see why) before the exit.
FATAL_GRACE_S = 2.0


def serve(server: Server, log_level: str = "info") -> int:
    """Serve until interrupted. Returns the exit status: 0, or 1 when the engine stopped on
    an inconsistent state (`AsyncEngine.fatal`, printed to stderr)."""
    import uvicorn
    try:
        import uvloop  # noqa: F401
        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    cfg = server.cfg
    config = uvicorn.Config(build_app(server), host=cfg.host, port=cfg.port, loop=loop,
                            log_level=log_level, access_log=log_level == "debug",
                            timeout_graceful_shutdown=2)
    uv = uvicorn.Server(config)

    def on_fatal(err):
        asyncio.get_running_loop().call_later(FATAL_GRACE_S, setattr, uv, "should_exit", True)
    server.engine.on_fatal = on_fatal
    freeze_startup_objects()
    log.info("serving %s on http://%s:%d", server.model_name, cfg.host, cfg.port)
    asyncio.run(uv.serve()) if loop == "asyncio" else uv.run()
    if server.engine.fatal is not None:
        print(f"error: the engine stopped: {server.engine.fatal!r}", file=sys.stderr)
        return 1
    return 0


def freeze_startup_objects() -> None:
    """Move what start-up made (the model, the tokenizer, the tables: ~190K objects for the
    default model) out of the collector's reach: a full collection walks them all, 75 ms on
    this machine, stalling whatever step it lands in. They live as long as the process, so
    nothing is lost by not scanning them."""
    gc.collect()
    gc.freeze()
