"""The OpenAPI document of `/api/v1` against the application's real routes, both ways: every
route is described, every described operation is routed, and path parameters agree."""

from __future__ import annotations

import re

from qlactors.web.app import routes
from qlactors.web.openapi import document


def _routed() -> set[tuple[str, str]]:
    return {(route.path, method.lower()) for route in routes() for method in route.methods
            if method != "HEAD" and route.path.startswith("/api/")}


def _described() -> set[tuple[str, str]]:
    return {(path, method) for path, ops in document()["paths"].items() for method in ops}


def test_every_route_is_described_and_every_description_is_routed():
    assert _routed() == _described()
    assert {route.path for route in routes() if not route.path.startswith("/api/")} == {"/", "/page.js", "/page.css", "/metrics"}


def test_path_parameters_are_the_routes_own():
    for path, ops in document()["paths"].items():
        placeholders = set(re.findall(r"\{(\w+)\}", path))
        for method, op in ops.items():
            declared = {p["name"] for p in op["parameters"] if p["in"] == "path"}
            assert declared == placeholders, (path, method)


def test_the_document_is_openapi_3_1_with_a_bearer_scheme_and_answers_for_every_operation():
    doc = document()
    assert doc["openapi"].startswith("3.1")
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["summary"] and op["responses"], (path, method)
            assert all(re.fullmatch(r"[1-5]\d\d", status) for status in op["responses"])
            if path != "/api/v1/openapi.json":
                assert "401" in op["responses"], (path, method)
            if method != "get":
                assert "403" in op["responses"], (path, method)
