"""The `[web]` section of a config file (the edge home's qlactors.toml, or a cluster's
control.toml): where `qlactors web` listens. The runtimes ignore the section."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput
from .knobs import read_toml

DEFAULT_LISTEN = "127.0.0.1:5700"


@dataclass(frozen=True, slots=True)
class Listen:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str, where: str) -> Listen:
    """`HOST:PORT` (an IPv6 host in brackets: `[::1]:5700`); port 1..65535."""
    if type(text) is not str:
        raise BadInput(f"{where}: give HOST:PORT as a string, e.g. \"{DEFAULT_LISTEN}\"")
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise BadInput(f"{where}: {text!r} is not HOST:PORT with a port from 1 to 65535, e.g. {DEFAULT_LISTEN}")
    return Listen(host, int(port))


@dataclass(frozen=True, slots=True)
class WebSettings:
    listen: Listen
    public_url: str  # the page's address as people reach it: notifications link to runs there


def web_settings(config_path: Path | None, given: str | None) -> WebSettings:
    """`--listen` when given, else `[web] listen` of the config file (when there is one), else
    127.0.0.1:5700; `[web] public_url` (e.g. the TLS proxy's https://tasks.example.org), else
    http://LISTEN."""
    table: dict = {}
    if config_path is not None and Path(config_path).is_file():
        table = read_toml(Path(config_path)).get("web", {})
        if not isinstance(table, dict):
            raise BadInput(f"{config_path}: [web] must be a table")
        unknown = set(table) - {"listen", "public_url"}
        if unknown:
            raise BadInput(f"{config_path}: unknown [web] key(s) {sorted(unknown)}; known: listen, public_url")
    listen = (parse_listen(given, "--listen") if given is not None
              else parse_listen(table.get("listen", DEFAULT_LISTEN), f"{config_path}: [web] listen"))
    public = table.get("public_url", f"http://{listen}")
    if type(public) is not str or not public.startswith(("http://", "https://")):
        raise BadInput(f"{config_path}: [web] public_url must be an http:// or https:// URL")
    return WebSettings(listen, public.rstrip("/"))
