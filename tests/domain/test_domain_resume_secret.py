"""The derived resume secret (SEMANTICS.md §9 Register once): the same for every copy of one
Register on every replica, different for every register id and worker, unknowable without the
replicas' secret key."""

from __future__ import annotations

import re

import pytest

from qlactors.domain.receipt import token_hash
from qlactors.domain.resume_secret import resume_secret

KEY = b"k" * 40  # a Z85 CURVE secret key is 40 bytes of text
OTHER_KEY = b"j" * 40


def test_every_copy_of_one_register_gets_the_same_secret_on_every_replica():
    first = resume_secret(KEY, "w1", "reg-1")
    assert resume_secret(bytes(KEY), "w1", "reg-1") == first  # a second replica, the same key pair
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", first)  # 256 bits of base64url, hashable as a token
    assert len(token_hash(first)) == 64


def test_the_secret_differs_by_register_id_worker_and_key():
    secrets = {resume_secret(KEY, "w1", "reg-1"), resume_secret(KEY, "w1", "reg-2"),
               resume_secret(KEY, "w2", "reg-1"), resume_secret(OTHER_KEY, "w1", "reg-1"),
               # no ambiguity where the worker id ends and the register id begins
               resume_secret(KEY, "w1r", "eg-1"), resume_secret(KEY, "w", "1reg-1")}
    assert len(secrets) == 6


@pytest.mark.parametrize("key, worker_id, register_id", [
    (b"short", "w1", "r"), ("k" * 40, "w1", "r"), (KEY, "", "r"), (KEY, "w1", "")])
def test_it_needs_a_real_key_a_worker_and_a_register_id(key, worker_id, register_id):
    with pytest.raises(ValueError):
        resume_secret(key, worker_id, register_id)
