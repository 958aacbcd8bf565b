"""Admin operations: retry, cancel, pause and resume (the admin scope)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from outboxq.api.auth import scoped
from outboxq.api.deps import JobId, PoolDep, QueueName, transaction
from outboxq.api.errors import error_responses
from outboxq.api.routing import OutboxqRoute
from outboxq.api.schemas import JobPublic, QueueState, RetriedCount, job_public
from outboxq.queue import admin
from outboxq.queue.jobs import Job

router = APIRouter(tags=["admin"], route_class=OutboxqRoute)


@router.post("/v1/jobs/{job_id}/retry", response_model=JobPublic, **scoped("admin"),
             responses=error_responses(401, 403, 404, 409, 422))
def retry_job(job_id: JobId, pool: PoolDep) -> JSONResponse:
    """Run a retrying, dead or cancelled job again now, whatever its attempts."""
    return _on_job(admin.retry_job, job_id, pool)


@router.post("/v1/queues/{queue}/retry", response_model=RetriedCount, **scoped("admin"),
             responses=error_responses(401, 403, 422))
def retry_queue(queue: QueueName, pool: PoolDep) -> JSONResponse:
    """Run every retrying and dead job of the queue again now; returns how many."""
    with transaction(pool) as conn:
        retried = admin.retry_queue(conn, queue)
    return JSONResponse({"queue": queue, "retried": retried})


@router.post("/v1/jobs/{job_id}/cancel", response_model=JobPublic, **scoped("admin"),
             responses=error_responses(401, 403, 404, 409, 422))
def cancel_job(job_id: JobId, pool: PoolDep) -> JSONResponse:
    """Cancel a queued, waiting or retrying job; ask a running one to stop."""
    return _on_job(admin.cancel_job, job_id, pool)


@router.post("/v1/queues/{queue}/pause", response_model=QueueState, **scoped("admin"),
             responses=error_responses(401, 403, 422))
def pause_queue(queue: QueueName, pool: PoolDep) -> JSONResponse:
    """Pause the queue: workers stop claiming its jobs until it is resumed."""
    return _on_queue(admin.pause_queue, queue, pool, paused=True)


@router.post("/v1/queues/{queue}/resume", response_model=QueueState, **scoped("admin"),
             responses=error_responses(401, 403, 422))
def resume_queue(queue: QueueName, pool: PoolDep) -> JSONResponse:
    """Resume a paused queue."""
    return _on_queue(admin.resume_queue, queue, pool, paused=False)


def _on_job(operation: Callable[[Any, int], Job], job_id: int, pool: Any) -> JSONResponse:
    """Apply an admin operation to one job in its own transaction; answer with the job as it now is."""
    with transaction(pool) as conn:
        job = operation(conn, job_id)
    return JSONResponse(job_public(job))


def _on_queue(operation: Callable[[Any, str], None], queue: str, pool: Any, *, paused: bool) -> JSONResponse:
    """Pause or resume a queue in its own transaction."""
    with transaction(pool) as conn:
        operation(conn, queue)
    return JSONResponse({"queue": queue, "paused": paused})
