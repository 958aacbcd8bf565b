"""Every exception of outboxq, in one module (re-exported by the top-level package).

The OutboxqError family is what the core raises; the HTTP layer maps it to status codes in one place. The
ApiError family is what the HTTP client raises for an error answer.
"""

from __future__ import annotations

# An error message names at most this many offending items, then says how many more there are.
MAX_LISTED = 5


class OutboxqError(Exception):
    """Base of every error outboxq raises on purpose."""

    code = "outboxq_error"


class InvalidInput(OutboxqError, ValueError):
    """An argument the caller must fix (bad queue name, bad option value...)."""

    code = "invalid_input"


class DuplicateJob(OutboxqError):
    """A job with the same (queue, key) already exists."""

    code = "duplicate_job"

    def __init__(self, queue: str, key: str):
        self.queue, self.key = queue, key
        super().__init__(
            f"a job with key {key!r} already exists in queue {queue!r}; "
            "use another key, or look the existing job up instead of enqueueing it again"
        )


class UnknownDependency(OutboxqError):
    """A depends_on entry names a (queue, key) that has no job."""

    code = "unknown_dependency"

    def __init__(self, missing: list[tuple[str, str]]):
        self.missing = missing
        names = ", ".join(f"({q!r}, {k!r})" for q, k in missing[:MAX_LISTED])
        more = f" and {len(missing) - MAX_LISTED} more" if len(missing) > MAX_LISTED else ""
        super().__init__(
            f"depends_on names jobs that do not exist: {names}{more}; enqueue those first "
            "(in the same transaction is fine)"
        )


class InvalidMarker(InvalidInput):
    """A marker that this server did not hand out for this queue (malformed, tampered with, or forged)."""

    code = "invalid_marker"


class InvalidLimit(InvalidInput):
    """A flow-control option that cannot be applied (a malformed rate limit, a negative concurrency...)."""

    code = "invalid_limit"


class InvalidPayload(OutboxqError, ValueError):
    """The consumer's valid_payload check (or the codec) rejected the payload."""

    code = "invalid_payload"


class IdNotFound(OutboxqError, LookupError):
    """Base of the errors for an id that names nothing (`what` says of which kind)."""

    what = "thing"

    def __init__(self, ident: int):
        self.ident = ident
        super().__init__(f"no {self.what} has id {ident}")


class JobNotFound(IdNotFound):
    """No job has that id."""

    code = "job_not_found"
    what = "job"
    job_id = property(lambda self: self.ident)


class InvalidFilter(InvalidInput):
    """A search or bulk filter that cannot be applied: a payload that is not a JSON object, or a filter that
    matches every job given without "all" (a bulk action over everything must say so)."""

    code = "invalid_filter"


class InvalidWorkflow(InvalidInput):
    """A workflow's steps do not make a DAG: a repeated or unknown step name, a step after itself, a cycle."""

    code = "invalid_workflow"


class ScheduleNotFound(OutboxqError, LookupError):
    """No schedule has that name (a worker writes the schedules its modules define when it starts)."""

    code = "schedule_not_found"


class WorkflowNotFound(IdNotFound):
    """No workflow has that id."""

    code = "workflow_not_found"
    what = "workflow"


class InvalidTransition(OutboxqError):
    """The job is not in a status that allows the asked operation."""

    code = "invalid_transition"


class SchemaOutOfDate(OutboxqError):
    """The database schema is not at the version this code needs."""

    code = "schema_out_of_date"


class LeaseLost(OutboxqError):
    """A worker tried to act on a job whose lease it no longer holds (it was fenced)."""

    code = "lease_lost"


class Snooze(Exception):  # noqa: N818 - raised by a handler as an instruction, not an error
    """Raise it in a handler to run the job again after `seconds`, without using up an attempt."""

    def __init__(self, seconds: float):
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < float("inf"):
            raise InvalidInput(f"Snooze needs a number of seconds >= 0, not {seconds!r}")
        super().__init__(f"snoozed for {seconds:g} s")
        self.seconds = float(seconds)


class IdempotencyKeyReused(OutboxqError):
    """The Idempotency-Key was already used for a request with another body."""

    code = "idempotency_key_reused"


class OutputTableMismatch(OutboxqError):
    """The output table exists but lacks columns the results (or the delivery hash) need."""


# ---------------------------------------------------------------- Spark processing


class BatchFailed(Exception):
    """The processor failed for the batch as a whole (not for a few jobs that could be set aside)."""

    def __init__(self, message: str, traceback: str | None = None, job_errors: dict[int, str] | None = None):
        super().__init__(message)
        self.traceback = traceback
        self.job_errors = job_errors or {}  # jobs that failed for a reason of their own


# ---------------------------------------------------------------- test helpers (outboxq.testing)


class JobFailed(AssertionError):
    """The handler raised (or was fenced) where the test expected success."""


# ---------------------------------------------------------------- the HTTP client (outboxq.client)


class ApiError(Exception):
    """The API answered with an error: its HTTP status, error code and message."""

    def __init__(self, status: int, code: str, message: str):
        self.status, self.code, self.message = status, code, message
        super().__init__(f"{status} {code}: {message}")


class InvalidRequest(ApiError):
    """400/422: the request must be fixed (the message says how)."""


class Unauthorized(ApiError):
    """401: no token, or an unknown one."""


class Forbidden(ApiError):
    """403: the token lacks the scope."""


class NotFound(ApiError):
    """404: no such job (or route)."""


class Conflict(ApiError):
    """409: a duplicate key, a job in the wrong status, or an Idempotency-Key reused with another body."""


class PayloadTooLarge(ApiError):
    """413: the payload is over the server's size limit."""


class Unavailable(ApiError):
    """503/429 (or no connection) still, after every retry."""


class WorkerFailed(OutboxqError):
    """A room of the worker failed beyond recovery: the worker stopped (`outboxq worker` exits 1)."""

    code = "worker_failed"
