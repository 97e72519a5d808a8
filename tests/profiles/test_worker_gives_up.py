"""A worker whose handshakes keep failing for a reason that will not fix itself (here: a
`server_key` that is not the replica's) exits 1 after `handshake_failures_max` failures in a row,
saying why, so an init system shows it failed (issue 28). A real `qlactors worker` process
against a real CURVE ROUTER on 127.0.0.1 holding another key pair."""

from __future__ import annotations

import subprocess

import zmq
import zmq.auth

from edge_harness import QLACTORS, clean_env
from qlactors.wire.curve_keys import new_key_pair


def test_a_worker_with_the_wrong_server_key_exits_1_after_its_bound_of_failed_handshakes(tmp_path):
    keys = tmp_path / "keys"
    new_key_pair(keys, "control")  # what the worker believes the replicas' key is
    new_key_pair(keys, "w1")
    new_key_pair(keys, "replica")  # what the replica really holds
    public, secret = zmq.auth.load_certificate(str(keys / "replica.key_secret"))
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    try:
        router.curve_server, router.curve_publickey, router.curve_secretkey = True, public, secret
        port = router.bind_to_random_port("tcp://127.0.0.1")
        (tmp_path / "state").mkdir()
        config = tmp_path / "w1.toml"
        config.write_text(f'profile = "worker"\n[worker]\ncontrol = ["tcp://127.0.0.1:{port}"]\n'
                          'server_key = "keys/control.key"\nkey = "keys/w1.key_secret"\nstate_dir = "state"\n'
                          "handshake_failures_max = 3\n")
        done = subprocess.run([*QLACTORS, "worker", "--config", str(config)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60, env=clean_env())
    finally:
        router.close(0)
        ctx.term()
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert "3 CURVE handshakes in a row failed" in done.stderr and "server_key" in done.stderr, done.stderr[-2000:]
    assert "event=link_handshake_failed" in done.stderr
