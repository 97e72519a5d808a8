"""Cluster configuration: control.toml and worker.toml show every setting at its default; paths
are relative to the file; a bad file is refused naming the key (BadInput: exit 2)."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from qlactors import config
from qlactors.config import DatabaseSettings, defaults_of
from qlactors.errors import BadInput

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PG = "postgresql+psycopg://qlactors@db.example:5432/qlactors"


def _write(tmp_path: Path, text: str, name: str = "c.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _expected(cls, loaded, base: Path) -> None:
    for name, default in defaults_of(cls).items():
        want = base / default if isinstance(default, Path) else default
        assert getattr(loaded, name) == want, name


def test_shipped_control_toml_lists_every_setting_at_its_default():
    loaded = config.load_config(CONFIGS / "control.toml")
    assert isinstance(loaded, config.ControlConfig)
    _expected(config.ControlConfig, loaded, CONFIGS)
    assert dataclasses.replace(loaded.database, url="") == DatabaseSettings()
    text = tomllib.loads((CONFIGS / "control.toml").read_text())
    assert set(text["control"]) == set(defaults_of(config.ControlConfig))
    assert set(text["database"]) == set(defaults_of(DatabaseSettings))
    assert (loaded.heartbeat_ms, loaded.session_lease_ms, loaded.run_lease_ms) == (10_000, 45_000, 30_000)
    assert (loaded.recovery_grace_ms, loaded.drain_grace_ms, loaded.cadence_tick_ms) == (120_000, 900_000, 1_000)


def test_shipped_worker_toml_lists_every_setting_at_its_default():
    loaded = config.load_config(CONFIGS / "worker.toml")
    assert isinstance(loaded, config.WorkerConfig)
    _expected(config.WorkerConfig, loaded, CONFIGS)
    text = tomllib.loads((CONFIGS / "worker.toml").read_text())
    assert set(text["worker"]) | {"launcher_shell"} == set(defaults_of(config.WorkerConfig))
    assert text["launcher"] == {"shell": "/bin/sh"}
    assert loaded.slots == 4 and loaded.labels == () and loaded.log_cap_bytes == 64 * 1024 * 1024


def test_paths_are_relative_to_the_config_files_directory(tmp_path, monkeypatch):
    sub = tmp_path / "etc"
    sub.mkdir()
    path = _write(sub, 'profile = "worker"\n[worker]\nkey = "k/w1.key_secret"\nstate_dir = "/var/q"\n'
                       'labels = ["gpu", "zone=eu", "gpu"]\nslots = 2\n')
    monkeypatch.chdir(tmp_path)
    loaded = config.load_config(Path("etc/c.toml"))
    assert loaded.key == sub / "k" / "w1.key_secret"
    assert loaded.server_key == sub / "keys" / "control.key"  # a default path too
    assert loaded.state_dir == Path("/var/q")
    assert loaded.labels == ("gpu", "zone=eu")
    assert loaded.runtime_settings().slots == 2
    assert loaded.journal_path == Path("/var/q/journal.sqlite")  # the file StateDir opens


def test_control_public_key_lies_beside_the_secret(tmp_path):
    loaded = config.load_config(_write(tmp_path, f'profile = "control"\n[database]\nurl = "{PG}"\n'))
    assert loaded.key == tmp_path / "keys" / "control.key_secret"
    assert loaded.public_key == tmp_path / "keys" / "control.key"
    assert loaded.runtime_settings().recovery_page == 16


def test_store_options_carry_the_pool_and_the_three_timeouts():
    db = DatabaseSettings(url=PG, lock_timeout_ms=1500)
    assert db.store_options() == dict(pool_size=8, lock_timeout_ms=1500, statement_timeout_ms=5000,
                                      idle_in_transaction_timeout_ms=5000)
    assert "pool_size" not in db.store_options(pool=False)  # a command keeps the default pool


@pytest.mark.parametrize("body, words", [
    ('profile = "worker"\n[database]\nurl = "x"\n', "[database] has no place in a worker config"),
    ('profile = "control"\n', "[database] url is missing"),
    ('profile = "control"\n[database]\nurl = "sqlite:///x.db"\n', "[database] url = 'sqlite"),
    (f'profile = "control"\n[database]\nurl = "{PG}"\nlock_timeout_ms = 10000\n',
     "[database] lock_timeout_ms = 10000 must be below [control] heartbeat_ms"),
    (f'profile = "control"\n[database]\nurl = "{PG}"\nstatement_timeout_ms = 4000\n[control]\nheartbeat_ms = 3000\n'
     'session_lease_ms = 9000\nrun_lease_ms = 9000\n', "statement_timeout_ms = 4000 must be below"),
    (f'profile = "control"\n[database]\nurl = "{PG}"\n[control]\nrecovery_grace_ms = 60000\n',
     "recovery_grace_ms = 60000 must be at least session_lease_ms"),
    (f'profile = "control"\n[database]\nurl = "{PG}"\n[control]\nrun_lease_ms = 15000\n',
     "run_lease_ms = 15000 must be at least twice heartbeat_ms"),
    (f'profile = "control"\n[database]\nurl = "{PG}"\n[control]\nrecovery_page = 65\n',
     "[control] recovery_page = 65 is out of range 1..64"),
    (f'profile = "control"\n[database]\nurl = "{PG}"\n[control]\nheartbeat = 5\n', "unknown [control] key 'heartbeat'"),
    (f'profile = "control"\n[database]\nurl = "{PG}"\n[control]\nbind = "0.0.0.0:5710"\n', "[control] bind"),
    (f'profile = "control"\n[database]\nurl = "{PG}"\n[worker]\nslots = 1\n', "unknown section"),
    ('profile = "worker"\n[worker]\ncontrol = []\n', "[worker] control = []"),
    ('profile = "worker"\n[worker]\nlabels = ["has space"]\n', "[worker] labels: label 'has space'"),
    ('profile = "worker"\n[worker]\nslots = "4"\n', "[worker] slots = '4' must be a whole number"),
    ('profile = "worker"\n[launcher]\nshell = "sh"\n', "[launcher] shell"),
    ('profile = "edge"\n', "profile = 'edge'"),
])
def test_a_bad_cluster_config_is_refused_naming_the_key(tmp_path, body, words):
    with pytest.raises(BadInput) as caught:
        config.load_config(_write(tmp_path, body))
    assert words in str(caught.value)
    assert str(tmp_path / "c.toml") in str(caught.value)


def test_the_edge_loader_is_unchanged_by_the_cluster_profiles(tmp_path):
    loaded = config.load(str(tmp_path), str(CONFIGS / "edge.toml"))
    assert loaded.runtime == config.DEFAULTS["edge"]
    with pytest.raises(BadInput, match="unknown section"):
        config.load(str(tmp_path), str(CONFIGS / "control.toml"))


def test_any_config_module_may_be_imported_first():
    import subprocess
    import sys

    for first in ("qlactors.config.cluster", "qlactors.config.home", "qlactors.config"):
        code = f"import {first}; from qlactors.config import ControlConfig, WorkerConfig, load_config"
        assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).returncode == 0


@pytest.mark.parametrize("written", ["postgresql://qlactors@db.example:5432/qlactors",
                                     "postgres://qlactors@db.example:5432/qlactors", PG])
def test_a_bare_postgresql_url_means_psycopg(tmp_path, written):
    loaded = config.load_config(_write(tmp_path, f'profile = "control"\n[database]\nurl = "{written}"\n'))
    assert loaded.database.url == PG


@pytest.mark.parametrize("written", ["postgresql+psycopg2://q@h/q", "mysql://q@h/q", "postgresql:q@h/q"])
def test_a_postgresql_url_for_another_driver_is_refused(tmp_path, written):
    with pytest.raises(BadInput) as caught:
        config.load_config(_write(tmp_path, f'profile = "control"\n[database]\nurl = "{written}"\n'))
    assert "a control replica needs PostgreSQL: postgresql://USER@HOST:5432/DB" in str(caught.value)


def test_a_knob_every_profile_has_is_declared_once():
    # `slots` in [runtime], [worker]; the pages in [runtime], [control]: one range, one default
    from qlactors.config.knobs import RUNTIME_KNOBS, knob_of

    shared = 0
    for cls in (config.ControlConfig, config.WorkerConfig):
        for f in dataclasses.fields(cls):
            if f.name in RUNTIME_KNOBS:
                assert knob_of(f) is RUNTIME_KNOBS[f.name], f"{cls.__name__}.{f.name}"
                assert f.default == getattr(config.DEFAULTS["standalone"], f.name)
                shared += 1
    assert shared == 11 + 11  # control, worker
    assert config.LIMITS["slots"] == (1, 256)
