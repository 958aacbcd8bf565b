"""Job, JobStatus and the table of allowed status transitions."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import MISSING, Field, dataclass, field, fields, make_dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any


class JobStatus(enum.StrEnum):
    """The statuses a job can be in, with the same names in the database and the APIs."""

    WAITING = "waiting"  # its dependencies are not done
    QUEUED = "queued"  # ready now, or at run_at
    RUNNING = "running"  # a worker holds its lease
    RETRYING = "retrying"  # a failed attempt waiting for its backoff
    DONE = "done"
    DEAD = "dead"  # attempts exhausted
    CANCELLED = "cancelled"


# The order in which claimed jobs are handed to the handlers (a claim's rows: UPDATE ... RETURNING gives none).
# itemgetter, not a lambda: the sort key of a claim's rows is made in C.
CLAIM_ORDER = itemgetter("priority", "run_at", "id")

# Every status change the system makes, and what makes it. Tests check the runtime against this table.
ALLOWED_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    # dependencies done (or failed, with on_dependency_failure="run") / cancel (or a failed dependency)
    JobStatus.WAITING: frozenset({JobStatus.QUEUED, JobStatus.CANCELLED}),
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.CANCELLED}),  # claim / cancel
    JobStatus.RUNNING: frozenset(
        {JobStatus.DONE, JobStatus.RETRYING, JobStatus.DEAD, JobStatus.CANCELLED, JobStatus.QUEUED}
    ),  # complete / fail, time out or rescue / cancel / a stopping worker hands back unstarted, or a snooze
    JobStatus.RETRYING: frozenset({JobStatus.RUNNING, JobStatus.QUEUED, JobStatus.CANCELLED}),
    JobStatus.DONE: frozenset({JobStatus.QUEUED}),  # admin re-run (testing helpers)
    # admin retry / admin cancel (a dead job holds its sequence until either)
    JobStatus.DEAD: frozenset({JobStatus.QUEUED, JobStatus.CANCELLED}),
    # admin retry / retry_workflow (a step cancelled because of a failed step waits again)
    JobStatus.CANCELLED: frozenset({JobStatus.QUEUED, JobStatus.WAITING}),
}


@dataclass(frozen=True, slots=True)
class Job:
    """A job as stored: what `enqueue`, `get_job` and the admin operations return."""

    id: int
    queue: str
    key: str | None = None
    status: JobStatus = JobStatus.QUEUED
    payload: Any = None
    priority: int = 0
    run_at: datetime | None = None
    attempts: int = 0
    max_attempts: int | None = None
    last_error: str | None = None
    last_traceback: str | None = None
    waiting_reason: str | None = None
    cancel_requested: bool = False
    context: dict | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None  # its first attempt's start
    attempt_started_at: datetime | None = None  # its latest attempt's start
    finished_at: datetime | None = None
    worker_id: str | None = None  # the worker process that ran (or runs) its latest attempt
    snoozes: int = 0  # times the handler snoozed it (outboxq.Snooze); attempts does not count them
    result: Any = None  # the handler's JSON return value
    progress: float | None = None  # 0.0-1.0, from ctx.set_progress() while it runs
    progress_message: str | None = None
    workflow_id: int | None = None  # a workflow's step: the workflow (outboxq.Workflow) and the step's name
    step: str | None = None
    sequence: str | None = None  # enqueue(sequence=...): its jobs run one at a time, in enqueue order

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        """A Job from a database row (a dict); unknown columns are ignored."""
        values = {f.name: row[f.name] for f in fields(cls) if f.name in row}
        if "status" in values:
            values["status"] = JobStatus(values["status"])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The job as plain JSON-able values."""
        out: dict[str, Any] = {}
        for name in _FIELD_NAMES:
            value = getattr(self, name)
            if isinstance(value, JobStatus):
                value = value.value
            elif isinstance(value, datetime):
                value = value.isoformat()
            out[name] = value
        return out


_FIELD_NAMES = tuple(f.name for f in fields(Job))  # dataclasses.fields() is slow on the per-job path


def _draft_field(f: Field[Any]) -> tuple[str, Any] | tuple[str, Any, Any]:
    return (f.name, f.type) if f.default is MISSING else (f.name, f.type, field(default=f.default))


# Job's frozen __init__ sets each of its fields through object.__setattr__: a quarter of what a large
# enqueue_many costs in Python. _JobDraft has the same fields and, with slots, the same memory layout, but is
# not frozen: its __init__ writes plain attributes (several times cheaper), and assigning Job as its __class__
# (which Python allows between classes of one layout) makes it a Job like any other: frozen, equal, hashable.
_JobDraft: Any = make_dataclass("_JobDraft", [_draft_field(f) for f in fields(Job)], slots=True, eq=False,
                                repr=False, match_args=False)
if _JobDraft.__slots__ != Job.__slots__:  # pragma: no cover - a field added in one place and not the other
    raise TypeError("_JobDraft must have Job's slots in Job's order")


@dataclass(frozen=True, slots=True)
class QueuedBatch:
    """Just-written queued jobs of one queue that differ only in id and payload (enqueue_many's usual batch),
    before any Job is built: what they share is held once. enqueue_many makes the Jobs (`jobs()`); the API
    answers from the ids and one job's fields (building every Job was a noticeable share of a large request)."""

    ids: Sequence[int]
    payloads: Sequence[Any]
    queue: str
    priority: int
    run_at: datetime
    max_attempts: int | None
    context: dict | None
    created_at: datetime
    # The payloads' JSON texts as written (None when a codec wrote bytes): the API's answer splices them in
    # rather than encoding each payload again.
    payload_texts: Sequence[str] | None = None

    def jobs(self, count: int | None = None) -> list[Job]:
        """The jobs (the first `count` of them), in order: built three times faster than by Job(...)."""
        jobs: list[Job] = []
        append = jobs.append
        queue, queued, priority, run_at = self.queue, JobStatus.QUEUED, self.priority, self.run_at
        max_attempts, context, created_at = self.max_attempts, self.context, self.created_at
        for job_id, payload in zip(self.ids[:count], self.payloads[:count], strict=True):
            draft = _JobDraft(id=job_id, queue=queue, status=queued, payload=payload, priority=priority,
                              run_at=run_at, max_attempts=max_attempts, context=context, created_at=created_at)
            draft.__class__ = Job
            append(draft)
        return jobs
