"""The queue core: enqueue in the caller's transaction, read jobs. No FastAPI or Spark imports here."""

from outboxq.errors import DuplicateJob, InvalidInput, InvalidPayload, UnknownDependency
from outboxq.queue.enqueue import (
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
    get_job,
    get_job_async,
)
from outboxq.queue.jobs import Job, JobStatus

__all__ = [
    "DuplicateJob",
    "InvalidInput",
    "InvalidPayload",
    "Job",
    "JobStatus",
    "UnknownDependency",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "get_job",
    "get_job_async",
]
