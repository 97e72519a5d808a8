"""The HTTP API's bearer tokens (issue 20, point 3), on SQLite and PostgreSQL: only a hash is kept,
a live name is unique, a revoke takes effect on the next check, and nothing odd checks as a token."""

from __future__ import annotations

import hashlib
import threading

import pytest
from sqlalchemy import insert, select

from qlactors.errors import AlreadyExists, BadInput, NotFound
from qlactors.store.admin.api_tokens import MAX_SECRET_CHARS, ApiTokens, TokenView, secret_hash
from qlactors.store.engine import Store
from qlactors.store.schema import api_tokens


@pytest.fixture
def tokens(repo):
    return ApiTokens(repo.store)


def rows(repo) -> list[dict]:
    with repo.store.read() as conn:
        return [dict(r._mapping) for r in conn.execute(select(api_tokens).order_by(api_tokens.c.id))]


def test_secret_hash_is_the_sha256_hex_of_the_secret():
    assert secret_hash("qlt_abc") == hashlib.sha256(b"qlt_abc").hexdigest()
    assert len(secret_hash("")) == 64
    assert secret_hash("\udcff") != secret_hash("\udcfe")  # any str hashes, undecodable bytes too


def test_a_new_token_checks_with_its_secret_and_says_what_it_may_do(tokens):
    view, secret = tokens.new("ci")
    ro_view, ro_secret = tokens.new("dash", read_only=True)
    assert secret.startswith("qlt_") and len(secret) > 40 and secret != ro_secret
    assert view == TokenView("ci", False, view.created_at_ms, None) and view.created_at_ms > 0
    assert tokens.check(secret) == view
    assert tokens.check(ro_secret) == ro_view and ro_view.read_only is True
    assert view.to_json() == {"name": "ci", "read_only": False, "created_at_ms": view.created_at_ms,
                              "revoked_at_ms": None}


def test_only_the_hash_of_the_secret_is_stored(repo, tokens):
    _, secret = tokens.new("ci")
    _, other = tokens.new("ro", read_only=True)
    stored = rows(repo)
    assert [r["secret_hash"] for r in stored] == [secret_hash(secret), secret_hash(other)]
    for row in stored:
        for value in row.values():
            assert secret not in str(value) and other not in str(value)
            assert secret[4:] not in str(value) and other[4:] not in str(value)


def test_a_revoked_token_no_longer_checks_and_its_name_can_be_used_again(repo, tokens):
    first, old_secret = tokens.new("ci")
    revoked = tokens.revoke("ci")
    assert revoked.name == "ci" and revoked.revoked_at_ms >= first.created_at_ms
    assert tokens.check(old_secret) is None
    with pytest.raises(NotFound, match="no live token named ci"):
        tokens.revoke("ci")
    second, new_secret = tokens.new("ci", read_only=True)
    assert tokens.check(new_secret) == second and tokens.check(old_secret) is None
    assert len(rows(repo)) == 2


def test_a_revoke_takes_effect_on_the_next_check_of_another_store(repo, tokens, store_url):
    """No cache: the web server's store sees a revoke made by the CLI's at once."""
    _, secret = tokens.new("ci")
    server = ApiTokens(Store(store_url))
    try:
        assert server.check(secret) is not None
        tokens.revoke("ci")
        assert server.check(secret) is None
    finally:
        server.store.close()


def test_a_second_live_token_of_a_name_is_refused_and_nothing_is_written(repo, tokens):
    view, secret = tokens.new("ci")
    before = rows(repo)
    with pytest.raises(AlreadyExists, match="nothing was written: revoke it first.*or pick another name"):
        tokens.new("ci", read_only=True)
    assert rows(repo) == before and tokens.check(secret) == view


def test_two_news_of_one_name_at_once_make_one_token(repo, store_url):
    stores = [Store(store_url) for _ in range(2)]
    barrier, results = threading.Barrier(2), []

    def make(store: Store) -> None:
        barrier.wait()
        try:
            results.append(ApiTokens(store).new("race"))
        except AlreadyExists as err:
            results.append(err)

    threads = [threading.Thread(target=make, args=(s,)) for s in stores]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        for s in stores:
            s.close()
    assert sorted(type(r).__name__ for r in results) == ["AlreadyExists", "tuple"]
    assert len(rows(repo)) == 1


def test_the_list_shows_live_tokens_by_name_then_revoked_ones(tokens):
    tokens.new("b")
    tokens.new("a", read_only=True)
    tokens.new("c")
    tokens.revoke("c")
    tokens.new("c")
    tokens.revoke("a")
    listed = tokens.list()
    assert [(v.name, v.revoked_at_ms is None) for v in listed] == [
        ("b", True), ("c", True), ("a", False), ("c", False)]
    assert listed[2].read_only is True


@pytest.mark.parametrize("name", ["", "x" * 65, "a b", "ü", "a/b", "ci\n", "a:b", None, 7])
def test_a_bad_name_is_refused_saying_what_is_allowed(repo, tokens, name):
    with pytest.raises(BadInput, match="1-64 letters, digits, '.', '_' or '-'"):
        tokens.new(name)
    with pytest.raises(BadInput, match="1-64 letters"):
        tokens.revoke(name)
    assert rows(repo) == []


def test_the_longest_name_and_every_allowed_character_are_taken(tokens):
    for name in ("x" * 64, "A.z_0-9", "-", "."):
        view, secret = tokens.new(name)
        assert tokens.check(secret).name == name == view.name


def test_read_only_must_be_a_bool(repo, tokens):
    with pytest.raises(BadInput, match="read_only"):
        tokens.new("ci", read_only="yes")
    assert rows(repo) == []


def test_wrong_and_odd_secrets_check_as_nothing(tokens):
    _, secret = tokens.new("ci")
    for odd in (secret[:-1], secret + "x", secret.upper(), " " + secret, secret + "\n", secret[4:],
                "", "qlt_", "\udcff", "\x00", None, 42, secret.encode(), [secret]):
        assert tokens.check(odd) is None, odd


def test_a_secret_longer_than_any_new_makes_is_never_looked_up(repo, tokens):
    """Even with a row for its hash (which `new` never makes), an absurdly long secret is nothing."""
    longest, too_long = "q" * MAX_SECRET_CHARS, "q" * (MAX_SECRET_CHARS + 1)
    with repo.store.write() as conn:
        for i, secret in enumerate((longest, too_long)):
            conn.execute(insert(api_tokens).values(id=f"00000000-0000-7000-8000-00000000000{i}", name=f"n{i}",
                                                   secret_hash=secret_hash(secret), read_only=False,
                                                   created_at_ms=1))
    assert tokens.check(longest).name == "n0"
    assert tokens.check(too_long) is None
