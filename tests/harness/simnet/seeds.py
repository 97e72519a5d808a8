"""Which seeds a suite runs, and what a failing seed prints (its one-line replay)."""

from __future__ import annotations

import os

from .checker import violations
from .rig import SeedResult

DEFAULT_SEEDS = 12  # the default suite (each seed takes a few seconds on a 2-core machine)
CHAOS_SEEDS = 120  # `pytest -m chaos` (~12 min); QLACTORS_SIMNET_SEEDS overrides (`tox -e simnet`: 3,000)
CHAOS_FIRST = 100_000  # chaos seeds do not repeat the default suite's
CHAOS_PG_SEEDS = 20  # `pytest -m chaos` on PostgreSQL (~4 min); QLACTORS_SIMNET_PG_SEEDS overrides
CHAOS_PG_FIRST = 200_000


def chaos_seeds() -> range:
    count = int(os.environ.get("QLACTORS_SIMNET_SEEDS", CHAOS_SEEDS))
    first = int(os.environ.get("QLACTORS_SIMNET_FIRST", CHAOS_FIRST))
    return range(first, first + count)


def chaos_pg_seeds() -> range:
    """The chaos seeds run on PostgreSQL (fewer: each makes and drops a schema)."""
    count = int(os.environ.get("QLACTORS_SIMNET_PG_SEEDS", CHAOS_PG_SEEDS))
    return range(CHAOS_PG_FIRST, CHAOS_PG_FIRST + count)


def replay_seed() -> int:
    return int(os.environ.get("QLACTORS_SIMNET_SEED", "0"))


def replay_line(seed: int, database: str = "sqlite") -> str:
    db = "" if database == "sqlite" else f" QLACTORS_SIMNET_DB={database}"
    return f"replay: QLACTORS_SIMNET_SEED={seed}{db} pytest tests/profiles/test_simnet.py -k replay"


def verdict(result: SeedResult, database: str = "sqlite") -> str | None:
    """None when the seed held every invariant; else the report a failing test prints."""
    broken = violations(result.facts)
    if not broken:
        return None
    settled = "did not settle" if result.settled_s is None else f"settled {result.settled_s:.1f} s after the faults"
    return "\n".join([f"seed {result.seed}: {len(broken)} invariant(s) broken ({settled}; "
                      f"link frames {result.counts})", *(f"  {line}" for line in broken),
                      replay_line(result.seed, database)])
