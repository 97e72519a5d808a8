"""Web: how an API error is answered: a JSON body `{"error": {"code", "message"}}` with a stable
code, the HTTP status that goes with it, and the message the CLI would print (without its
`qlactors: ` prefix)."""

from __future__ import annotations

from starlette.responses import JSONResponse

from ..errors import AlreadyExists, BadInput, Conflict, DatabaseMissing, NotFound, QlactorsError, Retired, StoreUnavailable


class ApiError(QlactorsError):
    """A refusal of the HTTP layer itself (no token, a read-only token, a body that is no JSON)."""

    exit_status = 2

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


# Most specific first: the first class an error is an instance of decides.
_STATUS_OF = (
    (Retired, 404, "retired"),
    (NotFound, 404, "not_found"),
    (AlreadyExists, 409, "already_exists"),
    (BadInput, 422, "invalid"),
    (Conflict, 409, "conflict"),
    (DatabaseMissing, 503, "store_unavailable"),
    (StoreUnavailable, 503, "store_unavailable"),
)


def answer_for(err: QlactorsError) -> ApiError | None:
    """The answer to a qlactors error, or None for a bug (it propagates, and the server answers
    500 without details)."""
    if err.exit_status is None:
        return None
    for cls, status, code in _STATUS_OF:
        if isinstance(err, cls):
            return ApiError(status, code, str(err), field_of(err) if status == 422 else None)
    return ApiError(500, "runtime_error", str(err))


def field_of(err: QlactorsError) -> str | None:
    """The body field (a path: `trigger.cron`) a refusal names; None when it is about no one field."""
    from ..domain.cron_times import CronError
    from ..domain.retry import PolicyError

    field = getattr(err, "field", None)
    if field is None:
        return None
    if isinstance(err, CronError):
        return "trigger." + _TRIGGER_FIELDS.get(field, field)
    if isinstance(err, PolicyError):
        return "retry." + field
    return field


_TRIGGER_FIELDS = {"zone": "tz", "grace": "grace_ms"}


def error_response(err: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": 'Bearer realm="qlactors"'} if err.status == 401 else None
    error = {"code": err.code, "message": err.message}
    if err.status == 422:
        error["field"] = err.field  # null: about no one field (a task with active runs, say)
    return JSONResponse({"error": error}, status_code=err.status, headers=headers)
