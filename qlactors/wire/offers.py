"""The Offer record for an offered attempt, the Offers batch that carries them, and whether a task
revision's offer fits one frame."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ..domain.model import TaskSpec, TaskSpecError
from . import codec
from . import messages as m
from .validators import INT64_MAX

# The longest worker id a session may have (store/dispatch/dispatch.py checks it at 128 characters).
MAX_WORKER_ID_CHARS = 128


# What an Offers message costs besides its offers, at most: the longest worker, session and pull
# ids, the largest generation, the map keys and the array header (measured by a test).
ENVELOPE_BYTES = 512
# The bytes a batch of offers may take in one frame.
BATCH_BUDGET_BYTES = codec.MAX_FRAME_BYTES - ENVELOPE_BYTES


def offer_record(view: Any) -> m.Offer:
    """The Offer for an offered attempt (the store's OfferView): the only place one is built."""
    return m.Offer(
        run_id=view.run_id, attempt_id=view.attempt_id, attempt_number=view.attempt_number,
        offer_id=view.offer_id, lease_generation=view.lease_generation, lease_version=view.lease_version,
        lease_expires_at_ms=getattr(view, "lease_expires_at_ms", None),
        argv=list(view.argv), cwd=view.cwd, env=dict(view.env), timeout_ms=view.timeout_ms,
        stop_grace_ms=view.stop_grace_ms, log_cap_bytes=view.log_cap_bytes,
        keep_leftovers=view.keep_leftovers)


def offers_message(session: Any, pull: Any, views: list[Any]) -> m.Offers:
    """The answer to `pull` of `session` (worker_id, session_id, generation): its offers, maybe none."""
    return m.Offers(answer_to=pull.request_id, worker_id=session.worker_id, session_id=session.session_id,
                    session_generation=session.generation, pull_id=pull.pull_id,
                    offers=[offer_record(v) for v in views])


def check_offer(view: Any) -> int:
    """The bytes the offer for `view` takes in an Offers batch; codec.EncodeError (a ValueError)
    when it cannot be sent at all."""
    return len(codec.encode(m.Offers(answer_to="", worker_id="", session_id="", session_generation=0, pull_id="",
                                     offers=[offer_record(view)]))[1]) - _EMPTY_BODY_BYTES


def check_revision_fits(spec: TaskSpec) -> None:
    """TaskSpecError unless every offer of `spec` fits one wire frame, whatever its ids and counters.

    The real Offer is encoded with the longest ids and the largest integers the wire admits, so
    the check cannot drift from the codec (a cluster batches offers up to the same frame limit).
    """
    longest_id = "i" * m.MAX_ID_CHARS
    largest = INT64_MAX
    worst = SimpleNamespace(
        worker_id="w" * MAX_WORKER_ID_CHARS, session_id=longest_id, session_generation=largest,
        run_id=longest_id, attempt_id=longest_id, attempt_number=largest, offer_id=longest_id,
        lease_generation=largest, lease_version=largest, lease_expires_at_ms=largest,
        argv=spec.command.exec_argv(),
        cwd=spec.cwd, env=spec.env, timeout_ms=largest, stop_grace_ms=largest, log_cap_bytes=largest,
        keep_leftovers=spec.keep_leftovers)
    try:
        if check_offer(worst) > BATCH_BUDGET_BYTES:
            raise codec.EncodeError(f"its offer would take {check_offer(worst)} bytes of a batch")
    except codec.EncodeError as err:
        raise TaskSpecError(
            f"the command, --cwd and --env together do not fit one {codec.MAX_FRAME_BYTES}-byte wire "
            f"message ({err}): make them smaller, e.g. move large values into a file the job reads") from None


_EMPTY_BODY_BYTES = len(codec.encode(m.Offers(answer_to="", worker_id="", session_id="", session_generation=0,
                                             pull_id="", offers=[]))[1])
