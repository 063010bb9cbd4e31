"""OpenAI-compatible chat server: `python server.py` serves the embedded default model
(Gemma 3 270M) on 127.0.0.1:8000. `python server.py --help` lists every flag."""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys


def build_parser() -> argparse.ArgumentParser:
    from mimo.__main__ import add_engine_flags
    p = argparse.ArgumentParser(prog="python server.py", description=__doc__)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    g.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0: any free port)")
    g.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: no auth)")
    g.add_argument("--served-model-name", default=None,
                   help="model id clients send and /v1/models lists (default: --model)")
    g.add_argument("--max-body-bytes", type=int, default=8 * 2**20,
                   help="largest request body accepted (HTTP 413 above)")
    g.add_argument("--max-in-flight", type=int, default=256,
                   help="requests inside the pipeline at once; more wait in a queue")
    g.add_argument("--max-queued", type=int, default=1024,
                   help="requests waiting beyond --max-in-flight; more get HTTP 503")
    m = p.add_argument_group("media (vision-language models)")
    m.add_argument("--allowed-media-dir", action="append", default=[], metavar="DIR",
                   help="serve file:// URLs and plain paths under DIR (repeatable; default: "
                        "no local files)")
    m.add_argument("--allow-private-media-urls", action="store_true",
                   help="let media URLs reach loopback, private and link-local addresses "
                        "(default: refused, against SSRF)")
    m.add_argument("--max-media-bytes", type=int, default=64 * 2**20,
                   help="largest image or video accepted, per item (download, data: URL or "
                        "file; default 64 MiB)")
    m.add_argument("--image-max-pixels", type=int, default=None, metavar="N",
                   help="resize images to at most N pixels before encoding (N / 784 visual "
                        "tokens; default: the checkpoint's preprocessor_config.json bound)")
    m.add_argument("--embed-cache-bytes", type=int, default=512 * 2**20,
                   help="memory for cached vision-encoder outputs, per encoder worker "
                        "(default 512 MiB)")
    m.add_argument("--encoder-workers", type=int, default=1,
                   help="vision-encoder processes (default 1: the encoder runs in the server "
                        "process); N > 1 starts N processes, each loading the vision tower "
                        "and keeping its own --embed-cache-bytes cache, media routed to them "
                        "by consistent hashing of their content")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_engine_flags(p)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from mimo.__main__ import engine_opts
    from mimo.api.app import Server, build_app
    from mimo.config import ConfigError, ServerConfig
    from mimo.engine.async_engine import AsyncEngine
    from mimo.engine.engine import LLMEngine
    from mimo.llm import engine_config
    from mimo.multimodal.config import MediaConfig
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    try:
        scfg = ServerConfig(host=args.host, port=args.port, api_key=args.api_key,
                            served_model_name=args.served_model_name,
                            max_body_bytes=args.max_body_bytes, max_in_flight=args.max_in_flight,
                            max_queued=args.max_queued, embed_cache_bytes=args.embed_cache_bytes,
                            encoder_workers=args.encoder_workers)
        media = MediaConfig(allowed_media_dirs=tuple(args.allowed_media_dir),
                            allow_private=args.allow_private_media_urls,
                            max_bytes=args.max_media_bytes,
                            resize_max_pixels=args.image_max_pixels)
        engine = LLMEngine(engine_config(args.model, **engine_opts(args)))
        server = Server(scfg, AsyncEngine(engine), args.model, media)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import uvicorn
    try:
        import uvloop  # noqa: F401
        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    config = uvicorn.Config(build_app(server), host=scfg.host, port=scfg.port, loop=loop,
                            log_level=args.log_level, access_log=args.log_level == "debug",
                            timeout_graceful_shutdown=2)
    uv = uvicorn.Server(config)

    def on_fatal(err):
        # /health answers 503 for a moment (monitors see why), then the process exits non-zero.
        asyncio.get_running_loop().call_later(2.0, setattr, uv, "should_exit", True)
    server.engine.on_fatal = on_fatal
    logging.getLogger("mimo").info("serving %s on http://%s:%d", server.model_name, scfg.host,
                                   scfg.port)
    asyncio.run(uv.serve()) if loop == "asyncio" else uv.run()
    if server.engine.fatal is not None:
        print(f"error: the engine stopped: {server.engine.fatal!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
