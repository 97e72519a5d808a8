"""Web: `qlactors web`, the optional HTTP process: the JSON API under `/api/v1`, its OpenAPI
document, and the page at `/` (docs/web.md).

It is a separate process, never part of a runtime: the edge runtime keeps its no-TCP rule and
its idle budget. It reads and writes through the same store API and views as the CLI, on the
edge home's database (nudging the runtime after a change, as the CLI does) or on a cluster's
PostgreSQL database.
"""
