"""OpenAI-compatible chat server: `python server.py` serves the embedded default model
(Gemma 3 270M, a hybrid-SWA base model) on 127.0.0.1:8000; `bash serve.sh` puts `--model
smollm2-135m-instruct` (a chat model) before its flags: docs/first_chat.md."""
from __future__ import annotations

import argparse
import logging
import sys


def build_parser() -> argparse.ArgumentParser:
    from mimo.flags import add_engine_flags, add_server_flags
    p = argparse.ArgumentParser(prog="python server.py", description=__doc__)
    add_server_flags(p)
    add_engine_flags(p)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from mimo.api.app import Server
    from mimo.api.launch import serve
    from mimo.config import ConfigError
    from mimo.engine.async_engine import AsyncEngine
    from mimo.engine.engine import LLMEngine
    from mimo.flags import engine_opts, server_config
    from mimo.llm import engine_config
    from mimo.multimodal.config import MediaConfig
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    try:
        scfg = server_config(args)
        media = MediaConfig(allowed_media_dirs=tuple(args.allowed_media_dir),
                            allow_private=args.allow_private_media_urls,
                            max_bytes=args.max_media_bytes,
                            resize_max_pixels=args.image_max_pixels)
        if scfg.role == "encoder":           # the vision tower only: no engine
            from mimo.api.encoder_server import encoder_worker, serve_encoder
            return serve_encoder(encoder_worker(args, scfg), args.log_level)
        cfg = engine_config(args.model, **engine_opts(args))
        aeng = AsyncEngine.build(lambda: LLMEngine(cfg),     # loaded where it steps
                                 gather_wait=scfg.gather_wait)
        from mimo.disagg import decode_stage, role_routes
        stage = decode_stage(scfg, aeng)
        server = Server(scfg, aeng, args.model, media, generate=stage)
        server.extra_routes += role_routes(server, stage)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return serve(server, args.log_level)


if __name__ == "__main__":
    sys.exit(main())
