"""The Executor's parts and what they are given (issue 27, item 3): a part built from the
configuration holds no other part and no other part's method; the Executor alone feeds the attempt
machine and carries out its effects. Read from `Executor.__init__` and `_build_parts` themselves:
each keyword given to a part's constructor that is another part (`self.<part>`), a method of one
(`self.<part>.<method>`), or a closure over the Executor (a lambda) is a sibling wire.

The issue's goal is none; until the owners land, the count may only go down (the ceiling below is
lowered with each step, never raised)."""

from __future__ import annotations

import ast
import inspect
import textwrap

from qlactors.executor.executor import Executor

CEILING = 21  # issue 27 step 4; 37 before the attempt machine (with the forward-reference lambda)


def _constructions() -> list[tuple[str, ast.Call]]:
    calls = []
    for method in (Executor.__init__, Executor._build_parts):
        tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                target = node.targets[0]
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id == "self":
                    calls.append((target.attr, node.value))
    return calls


def _is_wire(value: ast.expr, classes: dict[str, type]) -> bool:
    """`self.<part>`, or `self.<part>.<method>` (a value read from a part, its capacity say, is not)."""
    if not isinstance(value, ast.Attribute):
        return False
    if isinstance(value.value, ast.Name) and value.value.id == "self":
        return value.attr in classes
    owner = value.value
    return (isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self"
            and owner.attr in classes and callable(getattr(classes[owner.attr], value.attr, None)))


def sibling_wires() -> dict[str, list[str]]:
    module = inspect.getmodule(Executor)
    classes = {name: getattr(module, call.func.id) for name, call in _constructions()
               if isinstance(call.func, ast.Name) and hasattr(module, call.func.id)}
    wires: dict[str, list[str]] = {}
    for name, call in _constructions():
        for kw in call.keywords:
            if isinstance(kw.value, ast.Lambda):
                wires.setdefault(name, []).append(f"{kw.arg}=lambda")
            elif _is_wire(kw.value, classes):
                wires.setdefault(name, []).append(f"{kw.arg}={ast.unparse(kw.value)}")
        for arg in call.args:
            if isinstance(arg, ast.Call):  # a part made inline for another
                wires.setdefault(name, []).append(f"{ast.unparse(arg)}")
    return wires


def test_parts_are_wired_to_each_other_less_and_less():
    wires = sibling_wires()
    total = sum(len(w) for w in wires.values())
    detail = "\n".join(f"{name}: {', '.join(w)}" for name, w in sorted(wires.items()))
    assert total <= CEILING, f"{total} sibling wires, the ceiling is {CEILING}:\n{detail}"


def test_the_count_sees_a_sibling_wire():
    """The counter itself: it finds the kinds of wire it counts."""
    wires = sibling_wires()
    assert any("=self." in w for ws in wires.values() for w in ws) or not wires
    assert "machine" in {name for name, _ in _constructions()}
