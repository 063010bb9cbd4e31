"""`python -m mimo.router --worker URL [--worker URL ...] [--redis URL]`: see --help."""
from __future__ import annotations

import logging
import sys


def main(argv=None) -> int:
    from ..config import ConfigError
    from .config import build_parser, router_config
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)    # one line per forwarded call
    try:
        cfg = router_config(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import uvicorn

    from .app import build_app
    from .router import Router
    prompts = None
    if cfg.model and cfg.policy == "cache-aware":
        from .prompt import PromptBuilder
        prompts = PromptBuilder(cfg.model, cfg.image_max_pixels)
    try:
        import uvloop  # noqa: F401
        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    uvicorn.run(build_app(Router(cfg, prompts)), host=cfg.host, port=cfg.port, loop=loop,
                log_level=args.log_level, access_log=args.log_level == "debug",
                timeout_graceful_shutdown=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
