"""`qlactors token new|revoke|list` as users drive it (issue 20, point 3): a real subprocess each, on
an edge home and on a cluster database. The secret is printed once, alone on stdout, and only its
hash reaches the database."""

from __future__ import annotations

import json
import sqlite3

import pytest

from qlactors.store.admin.api_tokens import ApiTokens, secret_hash
from qlactors.store.engine import Store
from cli_harness import assert_refused, in_parallel, ok, ql


def check(home, secret: str):
    """What the web server's `check` answers for `secret` on this home's database."""
    store = Store(f"sqlite:///{home / 'qlactors.db'}")
    try:
        return ApiTokens(store).check(secret)
    finally:
        store.close()


def test_token_new_prints_the_secret_alone_and_says_on_stderr_it_is_shown_once(tmp_path):
    home = tmp_path / "home"
    made = ok("token", "new", "ci", home=home)
    secret = made.stdout.strip()
    assert made.stdout == secret + "\n" and secret.startswith("qlt_") and " " not in secret
    [line] = made.stderr.strip().splitlines()
    assert line.startswith("qlactors: token ci made (read-write)")
    assert "shown only once" in line and "only its hash is stored" in line
    ro = ok("token", "new", "dash", "--read-only", home=home)
    assert "(read-only: it can read everything and change nothing)" in ro.stderr

    assert check(home, secret).name == "ci" and check(home, secret).read_only is False
    assert check(home, ro.stdout.strip()).read_only is True
    with sqlite3.connect(home / "qlactors.db") as db:
        stored = db.execute("SELECT * FROM api_tokens").fetchall()
    assert secret_hash(secret) in {row[2] for row in stored}
    assert not any(secret in str(value) or secret[4:] in str(value) for row in stored for value in row)


def test_token_revoke_ends_it_and_the_list_shows_it_revoked(tmp_path):
    home = tmp_path / "home"
    secret = ok("token", "new", "ci", home=home).stdout.strip()
    ok("token", "new", "ro", "--read-only", home=home)
    revoked = ok("token", "revoke", "ci", home=home)
    assert revoked.stdout.startswith("token ci revoked")
    assert check(home, secret) is None
    listed, text = in_parallel([(("token", "list", "--json"), {"home": home}),
                                (("token", "list"), {"home": home})])
    listed = json.loads(listed.stdout)
    assert [(t["name"], t["read_only"], t["revoked_at_ms"] is None) for t in listed] == [
        ("ro", True, True), ("ci", False, False)]
    assert set(listed[0]) == {"name", "read_only", "created_at_ms", "revoked_at_ms"}
    header, first, second = text.stdout.splitlines()
    assert header.split() == ["NAME", "ACCESS", "CREATED", "REVOKED"]
    assert first.split()[:2] == ["ro", "read-only"] and first.endswith("-")
    assert second.split()[:2] == ["ci", "read-write"] and not second.endswith("-")
    assert secret not in text.stdout and secret not in json.dumps(listed)


def test_token_refusals_exit_2_with_one_line_and_write_nothing(tmp_path):
    home = tmp_path / "home"
    secret = ok("token", "new", "ci", home=home).stdout.strip()
    bad, duplicate, unknown, not_utf8 = in_parallel([
        (("token", "new", "a b"), {"home": home}),
        (("token", "new", "ci", "--read-only"), {"home": home}),
        (("token", "revoke", "nope"), {"home": home}),
        (("token", "new", "\udcff"), {"home": home}),
    ])
    assert_refused(bad, "use 1-64 letters, digits, '.', '_' or '-'")
    assert_refused(duplicate, "a live token named ci already exists; nothing was written")
    assert_refused(unknown, "no live token named nope")
    assert_refused(not_utf8, "not valid UTF-8")
    assert [t["name"] for t in json.loads(ok("token", "list", "--json", home=home).stdout)] == ["ci"]
    assert check(home, secret).name == "ci"
    assert ql("token", home=home).returncode == 2  # an action is required


@pytest.mark.postgres
def test_token_commands_act_on_the_cluster_database_when_one_is_named(pg_schema_url, tmp_path):
    from cli_cluster_harness import Cluster

    cluster = Cluster(pg_schema_url, tmp_path)
    try:
        secret = cluster.ok("token", "new", "ci").stdout.strip()
        assert ApiTokens(cluster.repo.store).check(secret).name == "ci"
        listed = json.loads(cluster.ok("token", "list", "--json", env_url=True).stdout)
        assert [t["name"] for t in listed] == ["ci"]
        cluster.ok("token", "revoke", "ci", env_url=True)
        assert ApiTokens(cluster.repo.store).check(secret) is None
        assert not (cluster.tmp / "edge-home").exists()  # the edge home was never touched
    finally:
        cluster.close()
