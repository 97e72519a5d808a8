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
    again = subprocess.run([*QLACTORS, "keys", "new", "control", "--dir", str(tmp_path / "k")],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "already exists" in again.stderr
