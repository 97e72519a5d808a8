"""One error root (issue 19 rule 5): every exception class qlactors defines descends from
QlactorsError; the ones meaning "a peer sent something bad" are PeerFaults, which the Gateway
answers `refused` (its refusals: tests/control/test_gateway_peers.py, tests/control/test_gateway_actor.py)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import qlactors
from qlactors import cli
from qlactors.cli import cluster_commands
from qlactors.domain.posix import PosixTextError
from qlactors.domain.receipt import ReceiptError, token_hash
from qlactors.domain.transitions import InvalidTransition
from qlactors.errors import BadInput, PeerFault, QlactorsError
from qlactors.executor.log_shipping import LogShipper
from qlactors.faults import InjectedFault
from qlactors.errors import StoreUnavailable
from qlactors.store.dispatch.fenced_reports import FenceMismatch
from qlactors.store.records import Fenced
from qlactors.wire.codec import DecodeError, EncodeError, VersionMismatch
from qlactors.wire.curve import AuthenticatorDown

# An exception class allowed outside the root, with the reason why. Empty: keep it so.
EXEMPT: dict[str, str] = {}


def _exception_classes() -> dict[str, type]:
    """Every exception class defined in a module of qlactors, by its qualified name."""
    found = {}
    for info in pkgutil.walk_packages(qlactors.__path__, "qlactors."):
        if info.name == "qlactors.__main__":  # importing it runs the command
            continue
        module = importlib.import_module(info.name)
        for _name, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def test_every_exception_class_qlactors_defines_descends_from_qlactors_error():
    classes = _exception_classes()
    # The walk reaches every corner (a walk that found nothing would pass the check below).
    for name in ("qlactors.errors.BadInput", "qlactors.wire.validators.Complaint", "qlactors.faults.InjectedFault",
                 "qlactors.store.dispatch.fenced_reports.FenceMismatch", "qlactors.wire.curve.AuthenticatorDown",
                 "qlactors.domain.transitions.InvalidTransition", "qlactors.executor.state_dir.UnsafeStateDir"):
        assert name in classes, name
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, QlactorsError) and name not in EXEMPT)
    assert outside == [], f"exception classes outside QlactorsError: {outside}"


@pytest.mark.parametrize("cls", [BadInput, DecodeError, VersionMismatch, ReceiptError, PosixTextError,
                                 InvalidTransition])
def test_what_a_peer_can_send_wrong_is_a_peer_fault_and_still_a_value_error(cls):
    assert issubclass(cls, PeerFault) and issubclass(cls, ValueError)


@pytest.mark.parametrize("cls", [EncodeError, FenceMismatch, Fenced, StoreUnavailable, AuthenticatorDown,
                                 InjectedFault])
def test_this_sides_own_failures_are_no_peer_fault(cls):
    """The Gateway must never answer these as a peer's fault (InjectedFault, a crash test's bug,
    least of all: the actor must fail on it)."""
    assert issubclass(cls, QlactorsError) and not issubclass(cls, PeerFault)


def test_the_bases_callers_catch_are_kept():
    assert issubclass(EncodeError, ValueError)
    assert issubclass(AuthenticatorDown, RuntimeError) and issubclass(InjectedFault, RuntimeError)
    assert (BadInput.exit_status, QlactorsError.exit_status, PeerFault.exit_status) == (2, 1, 1)


def test_a_non_ascii_token_is_a_peer_fault_at_its_source():
    with pytest.raises(PeerFault, match="a callback token is ASCII base64url"):
        token_hash("jeton-\u00e9")


def test_an_acknowledgement_that_fits_no_chunk_in_flight_is_a_peer_fault():
    shipper = LogShipper()
    shipper.sent(0, 10, "0" * 64)
    with pytest.raises(PeerFault, match="past the sent offset"):
        shipper.acked(11)
    with pytest.raises(PeerFault, match="not the end of a chunk"):
        shipper.acked(5)


def test_a_command_says_a_qlactors_error_in_one_line_with_its_exit_status(monkeypatch, capsys):
    def fails(_args):
        raise BadInput("no such thing: nothing was written")

    monkeypatch.setattr(cluster_commands, "keys_new", fails)
    assert cli.main(["keys", "new", "w1"]) == 2
    assert capsys.readouterr().err == "qlactors: no such thing: nothing was written\n"


@pytest.mark.parametrize("cls", [InvalidTransition, PosixTextError, InjectedFault])
def test_a_command_lets_a_bug_through_with_its_traceback(monkeypatch, capsys, cls):
    """No exit status of its own: a command ends as with any bug (Python's traceback, status 1)."""
    assert cls.exit_status is None

    def fails(_args):
        raise cls("a bug")

    monkeypatch.setattr(cluster_commands, "keys_new", fails)
    with pytest.raises(cls, match="a bug"):
        cli.main(["keys", "new", "w1"])
    assert capsys.readouterr().err == ""
