"""The simulated network (issue 17): the worker's Executor and two replicas' Gateways on a real
store in one process, a seeded link between them that drops, duplicates, delays and reorders
every frame and restarts a Gateway now and then; after it settles, every invariant of
tests/simnet/checker.py holds. A failing seed prints itself and a one-line replay."""

from __future__ import annotations

import os

import pytest

from simnet.rig import run_seed
from simnet.seeds import DEFAULT_SEEDS, chaos_seeds, replay_seed, verdict


def _database(request) -> tuple[str | None, str]:
    if os.environ.get("QLACTORS_SIMNET_DB", "sqlite") == "postgres":
        return request.getfixturevalue("pg_schema_url"), "postgres"
    return None, "sqlite"


def _check(seed: int, tmp_path, request) -> None:
    tmp_path.mkdir(parents=True, exist_ok=True)
    url, database = _database(request)
    report = verdict(run_seed(seed, tmp_path, database_url=url), database)
    assert report is None, report


@pytest.mark.parametrize("seed", range(1, DEFAULT_SEEDS + 1))
def test_a_seed_of_faults_settles_with_every_invariant_held(seed, tmp_path, request):
    _check(seed, tmp_path, request)


def test_replay(tmp_path, request):
    """The seed of $QLACTORS_SIMNET_SEED (0 when unset), as a failing seed's replay line runs it;
    $QLACTORS_SIMNET_REPEAT times (1 when unset) until it fails, since a seed replays its faults
    but not the threads' interleaving."""
    for n in range(int(os.environ.get("QLACTORS_SIMNET_REPEAT", "1"))):
        _check(replay_seed(), tmp_path / f"run-{n}", request)


@pytest.mark.chaos
@pytest.mark.parametrize("seed", chaos_seeds())
def test_chaos_seed_settles_with_every_invariant_held(seed, tmp_path, request):
    _check(seed, tmp_path, request)
