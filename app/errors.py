"""The OutboxqError family: what the core raises. The HTTP layer maps them to status codes in one place."""

from __future__ import annotations


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
        names = ", ".join(f"({q!r}, {k!r})" for q, k in missing)
        super().__init__(
            f"depends_on names jobs that do not exist: {names}; enqueue those first "
            "(in the same transaction is fine)"
        )


class InvalidPayload(OutboxqError, ValueError):
    """The consumer's valid_payload check (or the codec) rejected the payload."""

    code = "invalid_payload"


class JobNotFound(OutboxqError, LookupError):
    """No job has that id."""

    code = "job_not_found"

    def __init__(self, job_id: int):
        self.job_id = job_id
        super().__init__(f"no job has id {job_id}")


class InvalidTransition(OutboxqError):
    """The job is not in a status that allows the asked operation."""

    code = "invalid_transition"


class SchemaOutOfDate(OutboxqError):
    """The database schema is not at the version this code needs."""

    code = "schema_out_of_date"


class LeaseLost(OutboxqError):
    """A worker tried to act on a job whose lease it no longer holds (it was fenced)."""

    code = "lease_lost"
