"""A cluster run by an operator, on real processes (issue 18): a worker started before its key is
allowed, a key revoked under running jobs, and two processes presenting one worker's key."""

from __future__ import annotations

import pytest

from actor_harness import wait_until
from cluster_harness import _online, make_cluster

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]


@pytest.fixture
def cluster(tmp_path):
    c = make_cluster(tmp_path, replicas=1)
    yield c
    c.close()


def _spawn_worker(cluster, name: str, *, slots: int = 1, state: str | None = None):
    """A worker process, not waited for (its key may not be allowed yet)."""
    config = cluster.worker_config(name, slots=slots, labels=())
    if state is not None:  # a second process with the same key needs a state directory of its own
        (cluster.root / state).mkdir(exist_ok=True)
        config = config.with_name(f"{state}.toml")
        config.write_text(cluster.worker_config(name, slots=slots, labels=()).read_text()
                          .replace(f'state_dir = "state-{name}"', f'state_dir = "{state}"'))
    proc = cluster._spawn(f"worker-{state or name}", ["worker", "--config", str(config)])
    cluster.workers[state or name] = proc
    return proc


def test_a_worker_started_before_its_key_is_allowed_connects_once_it_is(cluster):
    cluster.new_key("w1")
    worker = _spawn_worker(cluster, "w1")
    wait_until(lambda: "event=link_refused" in worker.log() or not worker.alive(), 30, "the refusal")
    assert worker.alive(), worker.log()
    cluster.allow("w1")
    wait_until(lambda: _online(cluster, "w1"), 50, "the worker to register after `worker allow`")
    assert worker.alive()
    log = worker.log()
    assert log.count("event=link_accepted_after_refusal") == 1, log
    cluster.cli("task", "add", "hello", "--", "true")
    run_id = cluster.cli("run", "hello").stdout.decode().strip()
    assert cluster.wait_terminal([run_id], timeout=30)[run_id]["state"] == "succeeded"
