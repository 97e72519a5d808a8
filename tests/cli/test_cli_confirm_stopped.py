"""`qlactors confirm-stopped RUN` (SEMANTICS.md §10): the real command against a migrated
PostgreSQL database; the operator's word for one stuck attempt, refused in one line (exit 2,
nothing written) without a matching attempt, and refused on edge."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from sqlalchemy import select

from qlactors.domain.transitions import ErrorCode
from qlactors.store.cadence.cluster_recovery import ClusterRecoveryCases
from qlactors.store.dispatch.dispatch import Dispatch
from qlactors.store.schema import run_attempts
from store_helpers import db_state
from cli_cluster_harness import QLACTORS, cluster  # noqa: F401 (the fixture)
from session_steps import attest, expire_lease, launch, register

pytestmark = pytest.mark.postgres


def evidence_of(cluster, attempt_id):  # noqa: F811
    with cluster.repo.store.read() as conn:
        return tuple(conn.execute(select(run_attempts.c.evidence, run_attempts.c.evidence_by,
                                         run_attempts.c.evidence_lease_generation)
                                  .where(run_attempts.c.id == attempt_id)).one())


def refused(done) -> str:
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("qlactors: "), done.stderr
    return done.stderr


def test_confirm_stopped_ends_one_stuck_attempt_and_records_who_said_it(cluster):  # noqa: F811
    dispatch = Dispatch.open(cluster.repo.store)
    session = register(dispatch, "w1")
    stuck = launch(cluster.repo, dispatch, session)
    attest(dispatch, session, stuck, session, "launch_unknown")  # never trusted: it waits
    bystander = launch(cluster.repo, dispatch, session)  # same worker, still renewed: untouched
    expire_lease(cluster.repo, stuck.quote.attempt_id)
    # (no replica is up: `status` exits 3 and still reports the waiting attempts)
    waiting = json.loads(cluster.ql("status", "--json").stdout)["unresolved_recoveries"]
    assert f"`qlactors confirm-stopped {stuck.quote.run_id}`" in waiting[0]["why"]

    done = cluster.ok("confirm-stopped", stuck.quote.run_id, "--by", "alice").stdout
    assert done.startswith(f"run {stuck.quote.run_id} attempt 1 ({stuck.quote.attempt_id}): recorded as "
                           "stopped by alice for lease generation 1")
    assert "RECOVERY_CONFIRMED_STOPPED" in done
    assert evidence_of(cluster, stuck.quote.attempt_id) == ("confirmed_stopped", "alice", 1)
    assert evidence_of(cluster, bystander.quote.attempt_id) == (None, None, None)
    assert json.loads(cluster.ql("status", "--json").stdout)["unresolved_recoveries"] == []

    cases = ClusterRecoveryCases(cluster.repo.store, recovery_grace_ms=120_000, drain_grace_ms=900_000)
    page, _more = cases.page(16)
    assert [c.attempt_id for c in page] == [stuck.quote.attempt_id]
    assert cases.resolve(page[0]).result == "applied"
    shown = json.loads(cluster.ok("show", stuck.quote.run_id, "--json").stdout)
    assert (shown["state"], shown["attempts"][-1]["error_code"]) == ("lost", ErrorCode.RECOVERY_CONFIRMED_STOPPED)
    before = db_state(cluster.repo, stuck.quote.run_id)
    assert "no live attempt" in refused(cluster.ql("confirm-stopped", stuck.quote.run_id))
    assert db_state(cluster.repo, stuck.quote.run_id) == before


def test_confirm_stopped_names_the_login_user_by_default(cluster):  # noqa: F811
    dispatch = Dispatch.open(cluster.repo.store)
    session = register(dispatch, "w1")
    flight = launch(cluster.repo, dispatch, session)
    expire_lease(cluster.repo, flight.quote.attempt_id)
    cluster.env.update(USER="carol", LOGNAME="carol")
    assert "stopped by carol" in cluster.ok("confirm-stopped", flight.quote.run_id, env_url=True).stdout
    assert evidence_of(cluster, flight.quote.attempt_id)[:2] == ("confirmed_stopped", "carol")


def test_confirm_stopped_refuses_in_one_line_and_writes_nothing(cluster):  # noqa: F811
    dispatch = Dispatch.open(cluster.repo.store)
    session = register(dispatch, "w1")
    live = launch(cluster.repo, dispatch, session)
    claimed = launch(cluster.repo, dispatch, session, activated=False, started=False)
    assert "no run with id 'ghost'" in refused(cluster.ql("confirm-stopped", "ghost"))
    for flight, words in ((live, "holds a live lease (worker w1 renews it"),
                          (claimed, "attempt 1 is never activated: nothing of it runs")):
        before = db_state(cluster.repo, flight.quote.run_id)
        assert words in refused(cluster.ql("confirm-stopped", flight.quote.run_id, "--by", "alice"))
        assert db_state(cluster.repo, flight.quote.run_id) == before


def test_confirm_stopped_on_edge_refuses_and_touches_no_home(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("QLACTORS_DATABASE_URL", "QLACTORS_HOME")}
    done = subprocess.run([*QLACTORS, "--home", str(tmp_path / "h"), "confirm-stopped", "some-run"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert "on edge, recovery reads the process itself" in refused(done)
    assert not (tmp_path / "h").exists()
