"""The Offer message for an offered attempt, and whether a task revision's offer fits one frame."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ..domain.model import TaskSpec, TaskSpecError
from . import codec
from . import messages as m

# The longest worker id a session may have (store/dispatch.py checks it at 128 characters).
MAX_WORKER_ID_CHARS = 128


def offer_message(view: Any) -> m.Offer:
    """The Offer for an offered attempt (the store's OfferView): the only place one is built."""
    return m.Offer(
        worker_id=view.worker_id, session_id=view.session_id, session_generation=view.session_generation,
        run_id=view.run_id, attempt_id=view.attempt_id, attempt_number=view.attempt_number,
        offer_id=view.offer_id, lease_generation=view.lease_generation, lease_version=view.lease_version,
        argv=list(view.argv), cwd=view.cwd, env=dict(view.env), timeout_ms=view.timeout_ms,
        stop_grace_ms=view.stop_grace_ms, log_cap_bytes=view.log_cap_bytes,
        keep_leftovers=view.keep_leftovers)


def check_offer(view: Any) -> None:
    """Raise codec.EncodeError (a ValueError) unless the offer for `view` can be sent as it is."""
    codec.encode(offer_message(view))


def check_revision_fits(spec: TaskSpec) -> None:
    """TaskSpecError unless every offer of `spec` fits one wire frame, whatever its ids and counters.

    The real Offer is encoded with the longest ids and the largest integers the wire admits, so
    the check cannot drift from the codec (a cluster batches offers up to the same frame limit).
    """
    longest_id = "i" * m.MAX_ID_CHARS
    largest = codec.INT64_MAX
    worst = SimpleNamespace(
        worker_id="w" * MAX_WORKER_ID_CHARS, session_id=longest_id, session_generation=largest,
        run_id=longest_id, attempt_id=longest_id, attempt_number=largest, offer_id=longest_id,
        lease_generation=largest, lease_version=largest, argv=spec.command.exec_argv(),
        cwd=spec.cwd, env=spec.env, timeout_ms=largest, stop_grace_ms=largest, log_cap_bytes=largest,
        keep_leftovers=spec.keep_leftovers)
    try:
        check_offer(worst)
    except codec.EncodeError as err:
        raise TaskSpecError(
            f"the command, --cwd and --env together do not fit one {codec.MAX_FRAME_BYTES}-byte wire "
            f"message ({err}): make them smaller, e.g. move large values into a file the job reads") from None
