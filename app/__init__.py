"""outboxq: a transactional-outbox job queue that lives inside PostgreSQL.

The public API: enqueue jobs in your own transaction (sync or async), write consumers, run a worker.

    from outboxq import enqueue, consumer, JobContext, Worker

`outboxq.testing.TestQueue` runs jobs deterministically in tests, `outboxq.client.Client` / `AsyncClient`
talk to the HTTP API, `outboxq.api.create_app()` is the whole HTTP service and `outboxq.api.create_router()`
its routes for your own FastAPI app. Every exception is in `outboxq.errors` and re-exported here.
"""

from outboxq.errors import (
    ApiError,
    BatchFailed,
    DuplicateJob,
    IdempotencyKeyReused,
    InvalidInput,
    InvalidLimit,
    InvalidMarker,
    InvalidPayload,
    InvalidTransition,
    InvalidWorkflow,
    JobFailed,
    JobNotFound,
    LeaseLost,
    OutboxqError,
    OutputTableMismatch,
    SchemaOutOfDate,
    Snooze,
    UnknownDependency,
    WorkerFailed,
    WorkflowNotFound,
)
from outboxq.queue.enqueue import (
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
    get_job,
    get_job_async,
)
from outboxq.queue.jobs import Job, JobStatus
from outboxq.queue.workflows import (
    Workflow,
    cancel_workflow,
    get_workflow,
    get_workflow_async,
    list_workflows,
    retry_workflow,
)
from outboxq.registry import Registry, default_registry
from outboxq.workers.context import JobContext
from outboxq.workers.periodic import Schedule, periodic
from outboxq.workers.registry import Consumer, consumer

__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "BatchFailed",
    "Consumer",
    "DuplicateJob",
    "IdempotencyKeyReused",
    "InvalidInput",
    "InvalidLimit",
    "InvalidMarker",
    "InvalidPayload",
    "InvalidTransition",
    "InvalidWorkflow",
    "Job",
    "JobContext",
    "JobFailed",
    "JobNotFound",
    "JobStatus",
    "LeaseLost",
    "OutboxqError",
    "OutputTableMismatch",
    "Registry",
    "Schedule",
    "SchemaOutOfDate",
    "Snooze",
    "UnknownDependency",
    "WorkerFailed",
    "Worker",
    "Workflow",
    "WorkflowNotFound",
    "cancel_workflow",
    "get_workflow",
    "get_workflow_async",
    "list_workflows",
    "retry_workflow",
    "consumer",
    "default_registry",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "get_job",
    "get_job_async",
    "periodic",
]


def __getattr__(name: str):
    """Worker is imported on first use: `from outboxq import enqueue` stays light for web processes."""
    if name == "Worker":
        from outboxq.workers.runner import Worker

        return Worker
    raise AttributeError(f"module 'outboxq' has no attribute {name!r}")
