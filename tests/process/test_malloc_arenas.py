"""The edge runtime caps glibc's malloc arenas before its threads start (process/malloc.py)."""

import subprocess
import sys


def test_limit_arenas_is_taken_by_glibc_in_a_fresh_process():
    code = "from qlactors.process.malloc import limit_arenas; print(limit_arenas(1))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "True", out.stderr


def test_the_edge_runtime_asks_for_one_arena_before_its_threads():
    import inspect

    from qlactors.profiles import edge

    source = inspect.getsource(edge.EdgeRuntime._build_and_start)
    assert edge.EDGE_MALLOC_ARENAS == 1
    assert source.index("limit_arenas(") < source.index("Bridge(")
