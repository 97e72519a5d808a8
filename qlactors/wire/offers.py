"""Whether a task revision's Offer fits one wire frame, whatever ids and counters it is offered with."""

from __future__ import annotations

from ..domain.model import TaskSpec, TaskSpecError
from . import codec
from . import messages as m

# The longest worker id a session may have (store/dispatch.py checks it at 128 characters).
MAX_WORKER_ID_CHARS = 128


def check_revision_fits(spec: TaskSpec) -> None:
    """TaskSpecError unless every offer of `spec` fits one wire frame, whatever its ids and counters.

    The real Offer is encoded with the longest ids and the largest integers the wire admits, so
    the check cannot drift from the codec (a cluster batches offers up to the same frame limit).
    """
    longest_id = "i" * m.MAX_ID_CHARS
    largest = codec.INT64_MAX
    worst = m.Offer(
        worker_id="w" * MAX_WORKER_ID_CHARS, session_id=longest_id, session_generation=largest,
        run_id=longest_id, attempt_id=longest_id, attempt_number=largest, offer_id=longest_id,
        lease_generation=largest, lease_version=largest, argv=list(spec.command.exec_argv()),
        cwd=spec.cwd, env=dict(spec.env), timeout_ms=largest, stop_grace_ms=largest,
        log_cap_bytes=largest)
    try:
        codec.encode(worst)
    except codec.EncodeError as err:
        raise TaskSpecError(
            f"the command, --cwd and --env together do not fit one {codec.MAX_FRAME_BYTES}-byte wire "
            f"message ({err}): make them smaller, e.g. move large values into a file the job reads") from None
