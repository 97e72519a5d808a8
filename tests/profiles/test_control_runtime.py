"""A running control replica (the real ControlRuntime on the real PostgreSQL, tcp and CURVE keys)
whose authenticator stops: it does not go on as if it were fine (SEMANTICS.md §9 Identity)."""

from __future__ import annotations

import logging
import threading

import pytest

from actor_harness import wait_until
from cluster_harness import free_port, make_cluster
from qlactors.config import load_config
from qlactors.profiles.control import ControlRuntime

pytestmark = pytest.mark.postgres


def test_a_replica_whose_authenticator_dies_stops_with_the_reason_and_exit_1(tmp_path, caplog):
    cluster = make_cluster(tmp_path, replicas=0)  # the database and the keys; the replica runs here
    try:
        port = free_port()
        cluster.ports = [port]
        runtime = ControlRuntime(load_config(cluster.control_config(port)))
        status: list[int] = []
        thread = threading.Thread(target=lambda: status.append(runtime.run()))
        caplog.set_level(logging.INFO, logger="qlactors")
        thread.start()
        try:
            assert runtime.started.wait(60), "the replica did not start"
            wait_until(lambda: cluster.sql("SELECT count(*) FROM control_replicas WHERE stopped_at_ms IS NULL")
                       == [(1,)], 30, "the replica's row")
            assert not runtime.ctx.fatal.event.is_set()
            runtime.authenticator.stop()  # as if its thread had died
            thread.join(60)
        finally:
            if thread.is_alive():
                runtime.stop()
                thread.join(60)
        assert status == [1]
        messages = [r.getMessage() for r in caplog.records]
        assert "event=curve_authenticator_down action=stop_replica" in messages
        assert any(m.startswith("event=runtime_stopping reason=the CurveZMQ authenticator is not running")
                   for m in messages)
        # It stopped as a replica stops: `status` no longer counts it.
        assert cluster.sql("SELECT count(*) FROM control_replicas WHERE stopped_at_ms IS NULL") == [(0,)]
    finally:
        cluster.close()
