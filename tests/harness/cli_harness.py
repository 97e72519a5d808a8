"""The `qlactors` command as users drive it: a real subprocess per command, a clean environment, and
the checks of its answers; shared by the CLI tests."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path



_EXE = Path(sys.executable).parent / "qlactors"


QLACTORS = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "qlactors"]


UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


UNKNOWN_RUN = "01a22a70-6402-7001-a4c5-000000000000"


def clean_env(**extra: str) -> dict[str, str]:
    """The inherited environment without the variables that choose a home, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in ("QLACTORS_HOME", "XDG_DATA_HOME")}
    env.update(extra)
    return env


def ql(*args, home: Path | None = None, env: dict[str, str] | None = None,
       cwd: Path | None = None) -> subprocess.CompletedProcess:
    argv = list(QLACTORS)
    if home is not None:
        argv += ["--home", str(home)]
    argv += [str(a) for a in args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env=clean_env() if env is None else env, cwd=cwd)


def ok(*args, **kw) -> subprocess.CompletedProcess:
    result = ql(*args, **kw)
    assert result.returncode == 0, (args, result.returncode, result.stdout, result.stderr)
    return result


def ok_json(*args, **kw):
    return json.loads(ok(*args, "--json", **kw).stdout)


def in_parallel(calls: list[tuple[tuple, dict]]) -> list[subprocess.CompletedProcess]:
    """Run independent `ql(*args, **kw)` calls side by side; results in the order given."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda call: ql(*call[0], **call[1]), calls))


def assert_refused(result: subprocess.CompletedProcess, fragment: str) -> None:
    """Exit 2, nothing on stdout, one clear `qlactors: ...` line naming the problem."""
    what = (result.args, result.returncode, result.stdout, result.stderr)
    assert result.returncode == 2, what
    assert result.stdout == "", what
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, what
    assert lines[-1].startswith("qlactors: "), what
    assert fragment.lower() in lines[-1].lower(), what
    assert "Traceback" not in result.stderr, what
