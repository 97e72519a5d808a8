"""Configuration: the shipped configs/*.toml show exactly the built-in defaults; bad files are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from qlactors import config
from qlactors.errors import BadInput

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("profile", config.PROFILES)
def test_shipped_config_shows_every_knob_at_its_default(profile, tmp_path):
    loaded = config.load(str(tmp_path), str(CONFIGS / f"{profile}.toml"))
    assert loaded.profile == profile
    assert loaded.runtime == config.DEFAULTS[profile]
    text = (CONFIGS / f"{profile}.toml").read_text()
    for knob in config.LIMITS:
        assert f"\n{knob} = " in text


def test_no_file_means_edge_defaults_and_sqlite_in_home(tmp_path):
    loaded = config.load(str(tmp_path))
    assert loaded.profile == "edge"
    assert loaded.database_url == f"sqlite:///{tmp_path / 'qlactors.db'}"


def test_home_resolution_order(tmp_path):
    env = {"QLACTORS_HOME": str(tmp_path / "a"), "XDG_DATA_HOME": str(tmp_path / "x")}
    assert config.resolve_home(str(tmp_path / "b"), env) == tmp_path / "b"
    assert config.resolve_home(None, env) == tmp_path / "a"
    assert config.resolve_home(None, {"XDG_DATA_HOME": str(tmp_path / "x")}) == tmp_path / "x" / "qlactors"


@pytest.mark.parametrize("body, words", [
    ("[runtime]\nslots = 0\n", "out of range"),
    ("[runtime]\nslots = true\n", "must be a whole number"),
    ("[runtime]\nslots = 2.5\n", "slots = 2.5 must be a whole number in 1..256"),
    ('[runtime]\nslots = "four"\n', "must be a whole number"),
    ("[runtime]\nnope = 1\n", "unknown [runtime]"),
    ("[bogus]\n", "unknown section"),
    ('profile = "cloud"\n', "unknown profile"),
    ("this is not toml", "not valid TOML"),
])
def test_bad_config_is_refused_with_a_clear_message(tmp_path, body, words):
    path = tmp_path / "q.toml"
    path.write_text(body)
    with pytest.raises(BadInput, match=words.replace("[", r"\[")):
        config.load(str(tmp_path), str(path))
