"""CurveZMQ key files: `keys new` makes a pair (secret 0600) and never overwrites; loading says
clearly what is wrong with a file; the keys really authenticate a CURVE connection."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from qlactors.errors import BadInput
from qlactors.wire.curve_keys import load_key_pair, load_public_key, new_key_pair

_EXE = Path(sys.executable).parent / "qlactors"
QLACTORS = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "qlactors"]


def test_new_pair_has_a_private_secret_and_loads_back(tmp_path):
    public, secret = new_key_pair(tmp_path / "keys", "w1")
    assert (public.name, secret.name) == ("w1.key", "w1.key_secret")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
    pub, sec = load_key_pair(secret)
    assert load_public_key(public) == pub and len(pub) == 40 and len(sec) == 40
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == ["w1.key", "w1.key_secret"]


def test_an_existing_pair_is_never_overwritten(tmp_path):
    public, secret = new_key_pair(tmp_path, "w1")
    before = (public.read_bytes(), secret.read_bytes())
    with pytest.raises(BadInput, match="already exists; nothing was written"):
        new_key_pair(tmp_path, "w1")
    secret.unlink()  # half a pair left: still refused, the public file is kept
    with pytest.raises(BadInput, match="w1.key already exists"):
        new_key_pair(tmp_path, "w1")
    assert public.read_bytes() == before[0]


def test_a_name_with_a_slash_is_refused(tmp_path):
    with pytest.raises(BadInput, match="key name"):
        new_key_pair(tmp_path, "../w1")


def test_loading_errors_say_what_is_wrong(tmp_path):
    public, _secret = new_key_pair(tmp_path, "w1")
    with pytest.raises(BadInput, match="does not exist"):
        load_public_key(tmp_path / "nope.key")
    with pytest.raises(BadInput, match="holds no secret key"):
        load_key_pair(public)
    junk = tmp_path / "junk.key"
    junk.write_text("hello\n")
    with pytest.raises(BadInput, match="is not a CurveZMQ key file"):
        load_public_key(junk)
    bad = tmp_path / "bad.key"
    bad.write_text('metadata\ncurve\n    public-key = "tooshort"\n')
    with pytest.raises(BadInput, match="not a 40-character Z85"):
        load_public_key(bad)


def test_the_pair_authenticates_a_real_curve_connection(tmp_path):
    server_pub, server_sec = load_key_pair(new_key_pair(tmp_path, "control")[1])
    client_pub, client_sec = load_key_pair(new_key_pair(tmp_path, "w1")[1])
    ctx = zmq.Context()
    try:
        server = ctx.socket(zmq.REP)
        server.curve_server, server.curve_secretkey, server.curve_publickey = True, server_sec, server_pub
        port = server.bind_to_random_port("tcp://127.0.0.1")
        client = ctx.socket(zmq.REQ)
        client.curve_serverkey = load_public_key(tmp_path / "control.key")
        client.curve_publickey, client.curve_secretkey = client_pub, client_sec
        client.connect(f"tcp://127.0.0.1:{port}")
        client.send(b"ping")
        assert server.poll(10_000) and server.recv() == b"ping"
    finally:
        ctx.destroy(linger=0)


def test_keys_new_command(tmp_path):
    made = subprocess.run([*QLACTORS, "keys", "new", "control", "--dir", str(tmp_path / "k")],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert f"{tmp_path / 'k' / 'control.key_secret'}" in made.stdout
    # The replicas share one pair (docs/cluster.md step 2): the secret is not one host's alone.
    assert "(0600: copy it only to the hosts that use it, keeping the mode)" in made.stdout
    again = subprocess.run([*QLACTORS, "keys", "new", "control", "--dir", str(tmp_path / "k")],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "already exists" in again.stderr


@pytest.mark.parametrize("mode, how", [(0o644, "readable"), (0o640, "readable"), (0o604, "readable"),
                                       (0o620, "writable"), (0o602, "writable")])
def test_a_secret_key_others_may_read_or_write_is_refused_like_ssh(tmp_path, mode, how):
    _public, secret = new_key_pair(tmp_path, "w1")
    secret.chmod(mode)
    with pytest.raises(BadInput) as err:
        load_key_pair(secret)
    assert str(err.value) == f"{secret} is {how} by others (mode {mode:04o}); run: chmod 600 {secret}"
    secret.chmod(0o600)  # what the line says to run
    assert len(load_key_pair(secret)[1]) == 40
    secret.chmod(0o400)  # the owner's alone, read-only: as good
    assert len(load_key_pair(secret)[1]) == 40


def test_a_secret_key_behind_a_symlink_is_judged_by_the_file_it_names(tmp_path):
    _public, secret = new_key_pair(tmp_path, "w1")
    link = tmp_path / "current.key_secret"
    link.symlink_to(secret)
    secret.chmod(0o644)
    with pytest.raises(BadInput, match="readable by others"):
        load_key_pair(link)


@pytest.mark.parametrize("profile", ["control", "worker"])
def test_control_and_worker_refuse_to_start_with_a_secret_key_others_can_read(tmp_path, profile):
    """The real command: one line with the chmod to run, exit 2 (bad input: nothing started, and
    trying again without the chmod cannot help), nothing written beside the config and keys."""
    keys = tmp_path / "keys"
    _control_public, control_secret = new_key_pair(keys, "control")
    _worker_public, worker_secret = new_key_pair(keys, "worker")
    config = tmp_path / f"{profile}.toml"
    if profile == "control":
        config.write_text('profile = "control"\n[database]\nurl = "postgresql+psycopg://q@127.0.0.1:1/q"\n')
        secret = control_secret
    else:
        config.write_text(f'profile = "worker"\n[worker]\nstate_dir = "{tmp_path / "state"}"\n')
        secret = worker_secret
    secret.chmod(0o644)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    done = subprocess.run([*QLACTORS, profile, "--config", str(config)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"qlactors: {secret} is readable by others (mode 0644); run: chmod 600 {secret}\n"
    assert done.stdout == ""
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
