"""CLI: `qlactors web`: the HTTP API and the page (qlactors/web), over the edge home or, with a
cluster database named, over PostgreSQL."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..store.repository import Repository


def web(repo: Repository, args: argparse.Namespace) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        from ..errors import BadInput

        raise BadInput("`qlactors web` needs its extra: pip install 'qlactors[web]'") from None
    from ..config.web import web_settings
    from ..web.backend import ClusterBackend, EdgeBackend
    from ..web.server import serve

    if args.cluster is not None:
        backend = ClusterBackend(repo, args.cluster)
        config_path = args.cluster.control.path if args.cluster.control is not None else None
    else:
        from ..config import CONFIG_FILE

        backend = EdgeBackend(repo, args.cfg)
        config_path = Path(args.config) if args.config else args.cfg.home / CONFIG_FILE
    return serve(backend, web_settings(config_path, args.listen), log_level=args.log_level)
