"""Which seeds a suite runs, and what a failing seed prints (its one-line replay)."""

from __future__ import annotations

import os

from .checker import explained, violations
from .rig import SeedResult

DEFAULT_SEEDS = 12  # the default suite (each seed takes a few seconds on a 2-core machine)
CHAOS_SEEDS = 120  # `pytest -m chaos` (~12 min); QLACTORS_SIMNET_SEEDS overrides (`tox -e simnet`: 3,000)
CHAOS_FIRST = 100_000  # chaos seeds do not repeat the default suite's
CHAOS_PG_SEEDS = 20  # `pytest -m chaos` on PostgreSQL (~4 min); QLACTORS_SIMNET_PG_SEEDS (and _PG_FIRST) override
CHAOS_PG_FIRST = 200_000
# Seeds with process faults (issue 26; simnet/schedule.py): each takes ~15-30 s.
DEFAULT_PROCESS_SEEDS = 3  # the default suite
PROCESS_FIRST = 300_000  # their own range (QLACTORS_SIMNET_PROCESS_FIRST)
CHAOS_PROCESS_SEEDS = 20  # `pytest -m chaos`; QLACTORS_SIMNET_PROCESS_SEEDS overrides (`tox -e simnet`: 1,000)
CHAOS_PROCESS_FIRST = 310_000


def chaos_seeds() -> range:
    count = int(os.environ.get("QLACTORS_SIMNET_SEEDS", CHAOS_SEEDS))
    first = int(os.environ.get("QLACTORS_SIMNET_FIRST", CHAOS_FIRST))
    return range(first, first + count)


def chaos_pg_seeds() -> range:
    """The chaos seeds run on PostgreSQL (fewer: each makes and drops a schema)."""
    count = int(os.environ.get("QLACTORS_SIMNET_PG_SEEDS", CHAOS_PG_SEEDS))
    first = int(os.environ.get("QLACTORS_SIMNET_PG_FIRST", CHAOS_PG_FIRST))
    return range(first, first + count)


def default_process_seeds() -> range:
    first = int(os.environ.get("QLACTORS_SIMNET_PROCESS_FIRST", PROCESS_FIRST))
    return range(first, first + DEFAULT_PROCESS_SEEDS)


def chaos_process_seeds() -> range:
    count = int(os.environ.get("QLACTORS_SIMNET_PROCESS_SEEDS", CHAOS_PROCESS_SEEDS))
    first = int(os.environ.get("QLACTORS_SIMNET_PROCESS_CHAOS_FIRST", CHAOS_PROCESS_FIRST))
    return range(first, first + count)


def replay_seed() -> int:
    return int(os.environ.get("QLACTORS_SIMNET_SEED", "0"))


def replay_process() -> bool:
    return os.environ.get("QLACTORS_SIMNET_PROCESS", "") not in ("", "0")


def replay_line(seed: int, database: str = "sqlite", process: bool = False) -> str:
    db = "" if database == "sqlite" else f" QLACTORS_SIMNET_DB={database}"
    proc = " QLACTORS_SIMNET_PROCESS=1" if process else ""
    return f"replay: QLACTORS_SIMNET_SEED={seed}{proc}{db} pytest tests/profiles/test_simnet.py -k replay"


def verdict(result: SeedResult, database: str = "sqlite", process: bool = False) -> str | None:
    """None when the seed held every invariant; else the report a failing test prints: what it
    broke, the stops and what asked for them, what the process schedule did, its replay line."""
    broken = violations(result.facts)
    if not broken:
        return None
    settled = "did not settle" if result.settled_s is None else f"settled {result.settled_s:.1f} s after the faults"
    return "\n".join([f"seed {result.seed}: {len(broken)} invariant(s) broken ({settled}; "
                      f"link frames {result.counts})", *(f"  {line}" for line in broken),
                      *(f"  ({line})" for line in explained(result.facts)),
                      *(f"  | {line}" for line in result.log),
                      replay_line(result.seed, database, process)])
