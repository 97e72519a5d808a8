"""Web: `/api/v1/status` (the runtime or the replicas and workers, active runs, waiting
recoveries, quarantined receipts, the disk reserve: what `status --json` says) and
`/api/v1/workers` (a cluster's workers; none on edge)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from .backend import EdgeBackend
from .requests import backend, blocking


def status_report(request: Request, *, listed: bool = True) -> dict:
    """What `status --json` says (`listed` False: without the oldest active runs listed)."""
    found = backend(request)
    if isinstance(found, EdgeBackend):
        from ..cli.runtime_commands import edge_status

        report = edge_status(found.repo, found.cfg, listed=listed)[0]
        return {"profile": "edge", **report}
    from ..cli.cluster_commands import cluster_status

    return cluster_status(found.repo, found.target, listed=listed).report


async def status(request: Request) -> JSONResponse:
    return JSONResponse(await blocking(status_report, request))


def _workers(request: Request) -> list:
    found = backend(request)
    if isinstance(found, EdgeBackend):
        return []  # edge runs every job itself: no worker sessions
    from ..store.admin.workers import Workers

    return [w.to_json() for w in Workers(found.repo.store).list().workers]


async def workers(request: Request) -> JSONResponse:
    return JSONResponse(await blocking(_workers, request))
