"""`import qlactors` and the domain stay free of I/O and heavy libraries (STYLE.md "Pure core")."""

from __future__ import annotations

import ast
import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

HEAVY = {"sqlalchemy", "zmq", "pykka", "psycopg", "msgpack"}
FORBIDDEN_IN_DOMAIN = HEAVY | {"os", "io", "socket", "subprocess", "time", "shutil", "pathlib",
                               "select", "signal", "threading"}


def _package_dir(name: str) -> pathlib.Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, f"{name} is not a package"
    return pathlib.Path(list(spec.submodule_search_locations)[0])


ROOT = _package_dir("qlactors")
DOMAIN = _package_dir("qlactors.domain")


def _module_file(name: str) -> pathlib.Path | None:
    """The source file of `qlactors[.x...]`, or None when it is not a module of the package."""
    parts = name.split(".")
    if parts[0] != "qlactors":
        return None
    base = ROOT.joinpath(*parts[1:])
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_in_source(source: str, module: str, is_package: bool,
                      filename: str = "<src>") -> list[tuple[str, int]]:
    """Every module a source imports, as (absolute dotted name, line), relative imports resolved.

    Inside qlactors `from X import y` also yields `X.y`, since y may be a submodule; the walker
    keeps only names that are files. Imports inside functions and `if` blocks count as much as
    top-level ones.
    """
    found: list[tuple[str, int]] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                if node.level - 1 > len(base_parts) - 1:
                    raise AssertionError(f"{filename}:{node.lineno}: relative import beyond top level")
                base = ".".join(base_parts[: len(base_parts) - (node.level - 1)])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.append((target, node.lineno))
            if target.split(".")[0] == "qlactors":  # `from qlactors.x import y`: y may be a module
                found.extend((f"{target}.{a.name}", node.lineno) for a in node.names if a.name != "*")
    return found


def walk_imports(start: list[pathlib.Path], seen: set[pathlib.Path] | None = None) -> dict[str, list[str]]:
    """Follow imports transitively inside `qlactors`; map each outside top-level module to its importers.

    `seen` collects every qlactors file the walk read.
    """
    outside: dict[str, list[str]] = {}
    seen = set() if seen is None else seen
    todo = list(start)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        module = _module_name(path)
        is_package = path.name == "__init__.py"
        for name, line in imports_in_source(path.read_text(), module, is_package, str(path)):
            parts = name.split(".")
            if parts[0] != "qlactors":
                where = f"{path.relative_to(ROOT.parent)}:{line} imports {name}"
                outside.setdefault(parts[0], []).append(where)
                continue
            # importing qlactors.a.b runs qlactors/__init__.py and qlactors/a/__init__.py too
            for i in range(1, len(parts) + 1):
                file = _module_file(".".join(parts[:i]))
                if file is not None:
                    todo.append(file)
    return outside


def domain_files() -> list[pathlib.Path]:
    return sorted(DOMAIN.glob("*.py"))


def test_import_qlactors_and_domain_loads_no_heavy_library(tmp_path):
    modules = ["qlactors", "qlactors.domain"] + [
        f"qlactors.domain.{p.stem}" for p in domain_files() if p.stem != "__init__"]
    code = ("import importlib, json, sys\n"
            f"for m in {modules!r}:\n"
            "    importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    assert "qlactors.domain.transitions" in loaded and "qlactors.domain.receipt" in loaded
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert not heavy, f"importing the domain loaded {heavy}"


def test_domain_source_imports_no_io_module():
    outside = walk_imports(domain_files())
    bad = {m: where for m, where in outside.items() if m in FORBIDDEN_IN_DOMAIN}
    assert not bad, "the domain (or a qlactors module it imports) imports I/O modules:\n" + "\n".join(
        line for where in bad.values() for line in where)


def test_import_walker_sees_known_imports_and_follows_the_package():
    outside = walk_imports([DOMAIN / "receipt.py"])
    assert {"json", "hashlib", "hmac"} <= set(outside)
    assert any("receipt.py" in w and "json" in w for w in outside["json"])
    # retry.py imports ..errors and .states: the walk reads those files too (and the packages' __init__)
    seen: set[pathlib.Path] = set()
    from_retry = walk_imports([DOMAIN / "retry.py"], seen)
    assert {ROOT / "errors.py", ROOT / "__init__.py", DOMAIN / "states.py",
            DOMAIN / "transitions.py"} <= seen
    assert "dataclasses" in from_retry and "enum" in from_retry  # enum only via .states


def test_import_walker_resolves_relative_and_nested_imports():
    src = ("from . import states\nfrom ..errors import BadInput\nfrom .. import ids\n"
           "def f():\n    import os.path\n    from socket import socket\n"
           "if True:\n    import time as clock\n")
    names = {n for n, _ in imports_in_source(src, "qlactors.domain.model", is_package=False)}
    assert {"qlactors.domain", "qlactors.domain.states", "qlactors.errors", "qlactors.errors.BadInput",
            "qlactors", "qlactors.ids", "os.path", "socket", "time"} <= names
    assert "socket.socket" not in names
    from_package = imports_in_source("from . import x\n", "qlactors.domain", is_package=True)
    assert [n for n, _ in from_package] == ["qlactors.domain", "qlactors.domain.x"]


def test_import_walker_reports_the_offending_file_and_line():
    # A walk that reaches qlactors/ids.py (which reads the clock) must name it: the check can fail.
    outside = walk_imports([ROOT / "ids.py"])
    assert {"os", "time"} <= set(outside)
    assert any(w.startswith("qlactors/ids.py:") and w.endswith("imports os") for w in outside["os"])


# -- the two sides (docs/architecture.md "Rules") -------------------------------------------------

FORBIDDEN_PACKAGE_PAIRS = {
    ("control", "executor"), ("executor", "control"),
    ("store", "executor"), ("store", "runtime"), ("store", "control"),
    ("runtime", "control"), ("runtime", "executor"), ("runtime", "profiles"),
    ("wire", "store"), ("process", "store"), ("process", "wire"),
}
"""(importer's package, imported package) inside qlactors that may never meet. Only the profiles
join the sides, and only profiles/edge.py holds both."""


def package_imports() -> list[tuple[str, str, str]]:
    """Every import between two top-level packages of qlactors: (importer, imported, "file:line")."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_name(path)
        parts = module.split(".")
        if len(parts) < 3 and path.name != "__init__.py":
            continue  # a top-level module (errors.py, ids.py, ...), not a package's
        importer = parts[1] if len(parts) > 1 else ""
        for name, line in imports_in_source(path.read_text(), module, path.name == "__init__.py", str(path)):
            target = name.split(".")
            if target[0] != "qlactors" or len(target) < 2 or _module_file(name) is None:
                continue
            found.append((importer, target[1], f"{path.relative_to(ROOT.parent)}:{line} imports {name}"))
    return found


def test_no_package_imports_a_package_it_must_not():
    bad = [where for importer, imported, where in package_imports()
           if (importer, imported) in FORBIDDEN_PACKAGE_PAIRS]
    assert not bad, "forbidden imports between packages:\n" + "\n".join(bad)


def test_only_the_edge_profile_imports_both_sides():
    sides: dict[str, set[str]] = {}
    for _importer, imported, where in package_imports():
        if imported in ("control", "executor"):
            sides.setdefault(where.split(":")[0], set()).add(imported)
    both = sorted(f for f, s in sides.items() if s == {"control", "executor"})
    assert both == ["qlactors/profiles/edge.py"], both


def test_the_package_import_table_sees_a_forbidden_import():
    # The check can fail: a source importing executor/ from control/ is listed.
    src = "from ..executor.journal.journal import Journal\n"
    names = [n for n, _ in imports_in_source(src, "qlactors.control.recovery", is_package=False)]
    assert "qlactors.executor.journal.journal" in names
    assert _module_file("qlactors.executor.journal.journal") is not None
    assert ("control", "executor") in FORBIDDEN_PACKAGE_PAIRS


# -- the executor side: one actor, composed parts, no circle (issue 19 rule 3) --------------------


def side_graph(side: str) -> dict[str, set[str]]:
    """The imports between the modules of one side (`qlactors.<side>.*`), by module name."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / side).rglob("*.py")):
        module = _module_name(path)
        names = imports_in_source(path.read_text(), module, path.name == "__init__.py", str(path))
        graph[module] = {n for n, _ in names
                         if n.startswith(f"qlactors.{side}.") and n != module and _module_file(n) is not None}
    return graph


def test_the_executor_parts_never_import_the_executor_actor():
    importers = sorted(m for m, imported in side_graph("executor").items() if "qlactors.executor.executor" in imported)
    assert importers == [], importers


def test_dispatch_and_control_are_records_of_parts_that_inherit_nothing():
    # Composition, not mixins (docs/architecture.md): each part is reached by its name on the
    # record, no part inherits another, and the record forwards nothing.
    import dataclasses
    import typing

    from qlactors.store.cadence.control import Control
    from qlactors.store.dispatch.dispatch import Dispatch

    for record, parts in ((Dispatch, {"sessions", "heartbeats", "attestations", "offers", "reports"}),
                          (Control, {"stops", "recovery", "status"})):
        fields = {f.name for f in dataclasses.fields(record)}
        assert fields == parts | {"store"}, record
        assert record.__bases__ == (object,), record
        hints = typing.get_type_hints(record)
        assert all(hints[name].__bases__ == (object,) for name in parts), {n: hints[n].__bases__ for n in parts}
        assert [n for n in vars(record) if not n.startswith("_") and n not in fields] == ["open"], record


# -- no import circles; modules and functions of a readable size (or a `Size:` reason) --------------

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def module_graph() -> dict[str, set[str]]:
    """qlactors module -> the qlactors modules it imports (function-level imports count too)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_name(path)
        targets = graph.setdefault(module, set())
        for name, _line in imports_in_source(path.read_text(), module, path.name == "__init__.py", str(path)):
            if _module_file(name) is not None and name != module:
                targets.add(name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle():
    assert circles(module_graph()) == []


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


# -- store/'s sub-packages import each other downward only (docs/architecture.md) -------------------

STORE_SUBPACKAGES_MAY_IMPORT = {
    "intent": set(), "dispatch": set(), "cadence": {"intent", "dispatch"}, "admin": {"dispatch"},
}
"""Each sub-package of store/ and the siblings it may import; every one may import store/'s top."""


def store_subpackage_imports() -> list[tuple[str, str, str]]:
    """Every import between two sub-packages of store/: (importer, imported, "file:line")."""
    found = []
    for path in sorted((ROOT / "store").rglob("*.py")):
        module = _module_name(path)
        parts = module.split(".")
        if len(parts) < 3 or parts[2] not in STORE_SUBPACKAGES_MAY_IMPORT:
            continue  # store/'s top modules and migrations/
        for name, line in imports_in_source(path.read_text(), module, path.name == "__init__.py", str(path)):
            target = name.split(".")
            if (target[:2] == ["qlactors", "store"] and len(target) > 2 and target[2] != parts[2]
                    and target[2] in STORE_SUBPACKAGES_MAY_IMPORT and _module_file(name) is not None):
                found.append((parts[2], target[2], f"{path.relative_to(ROOT.parent)}:{line} imports {name}"))
    return found


def test_store_subpackages_import_each_other_downward_only():
    subpackages = {p.parent.name for p in (ROOT / "store").glob("*/__init__.py")} - {"migrations"}
    assert subpackages == set(STORE_SUBPACKAGES_MAY_IMPORT), "a new sub-package of store/ needs its row"
    found = store_subpackage_imports()
    bad = [where for importer, imported, where in found if imported not in STORE_SUBPACKAGES_MAY_IMPORT[importer]]
    assert not bad, "store sub-packages importing a sibling they must not:\n" + "\n".join(bad)
    graph: dict[str, set[str]] = {}
    for importer, imported, _where in found:
        graph.setdefault(importer, set()).add(imported)
    assert circles(graph) == []
    assert circles({k: set(v) for k, v in STORE_SUBPACKAGES_MAY_IMPORT.items()}) == []


def test_the_store_checks_see_nested_modules():
    # An upward import from a sub-package resolves to its sibling (the check can fail) ...
    names = [n for n, _ in imports_in_source("from ..cadence.stops import Stops\n",
                                             "qlactors.store.dispatch.offers", is_package=False)]
    assert "qlactors.store.cadence.stops" in names and "cadence" not in STORE_SUBPACKAGES_MAY_IMPORT["dispatch"]
    # ... and the forbidden-pair table keys a nested module on its top-level package (store).
    assert any(importer == "store" and where.startswith("qlactors/store/dispatch/")
               for importer, _imported, where in package_imports())


def _size_reason(source: str) -> str | None:
    """A module says why it is long in one docstring line starting `Size:`."""
    doc = ast.get_docstring(ast.parse(source)) or ""
    return next((line for line in doc.splitlines() if line.startswith("Size:")), None)


def too_long(source: str, where: str) -> list[str]:
    """What in one module is over the bounds, unless its docstring has a `Size:` line."""
    if _size_reason(source) is not None:
        return []
    long = []
    lines = source.count("\n")
    if lines > MAX_MODULE_LINES:
        long.append(f"{where}: {lines} lines")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                long.append(f"{where}:{node.lineno} {node.name}: {length} lines")
    return long


def test_modules_and_functions_are_short_or_say_why():
    long = [line for path in sorted(ROOT.rglob("*.py"))
            for line in too_long(path.read_text(), str(path.relative_to(ROOT.parent)))]
    assert not long, "too long, and no `Size:` line in the module docstring says why:\n" + "\n".join(long)


def test_the_size_check_sees_a_long_function_and_takes_a_reason():
    body = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert too_long(body, "m.py") == [f"m.py:1 f: {MAX_FUNCTION_LINES + 1} lines"]
    assert too_long('"""Doc.\n\nSize: one table read whole."""\n' + body, "m.py") == []


# -- each module says where it lives (issue 19 rule 9) ---------------------------------------------

SIDE_WORDS = {"control": "Control side:", "executor": "Executor side:", "runtime": "Shared:",
              "profiles": "Profile:", "store": "Store:", "web": "Web:"}


def side_word_missing(package: str) -> list[str]:
    """The modules of `package` (sub-packages too, not their __init__) whose docstring does not start
    with the package's word."""
    word = SIDE_WORDS[package]
    return [str(path.relative_to(ROOT.parent)) for path in sorted((ROOT / package).rglob("*.py"))
            if path.name != "__init__.py"
            and not (ast.get_docstring(ast.parse(path.read_text())) or "").startswith(word)]


@pytest.mark.parametrize("package", sorted(SIDE_WORDS))
def test_every_module_docstring_starts_with_its_side(package):
    assert side_word_missing(package) == []


def test_the_side_word_check_sees_a_module_that_does_not_say(tmp_path, monkeypatch):
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "a.py").write_text('"""Store: one job."""\n')
    (tmp_path / "store" / "b.py").write_text('"""Control side: the wrong room."""\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert side_word_missing("store") == [f"{tmp_path.name}/store/b.py"]
