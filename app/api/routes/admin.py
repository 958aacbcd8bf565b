"""Admin operations: retry, cancel, pause and resume (the admin scope)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from outboxq.api.auth import scoped
from outboxq.api.deps import JobId, PoolDep, QueueName, transaction
from outboxq.api.errors import error_responses
from outboxq.api.routing import OutboxqRoute
from outboxq.api.schemas import JobPublic, QueueState, RetriedCount, job_public
from outboxq.queue import admin

router = APIRouter(tags=["admin"], route_class=OutboxqRoute)


@router.post("/v1/jobs/{job_id}/retry", response_model=JobPublic, **scoped("admin"),
             responses=error_responses(401, 403, 404, 409, 422))
def retry_job(job_id: JobId, pool: PoolDep) -> JSONResponse:
    """Run a retrying, dead or cancelled job again now, whatever its attempts."""
    with transaction(pool) as conn:
        job = admin.retry_job(conn, job_id)
    return JSONResponse(job_public(job))


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
    with transaction(pool) as conn:
        job = admin.cancel_job(conn, job_id)
    return JSONResponse(job_public(job))


@router.post("/v1/queues/{queue}/pause", response_model=QueueState, **scoped("admin"),
             responses=error_responses(401, 403, 422))
def pause_queue(queue: QueueName, pool: PoolDep) -> JSONResponse:
    """Pause the queue: workers stop claiming its jobs until it is resumed."""
    with transaction(pool) as conn:
        admin.pause_queue(conn, queue)
    return JSONResponse({"queue": queue, "paused": True})


@router.post("/v1/queues/{queue}/resume", response_model=QueueState, **scoped("admin"),
             responses=error_responses(401, 403, 422))
def resume_queue(queue: QueueName, pool: PoolDep) -> JSONResponse:
    """Resume a paused queue."""
    with transaction(pool) as conn:
        admin.resume_queue(conn, queue)
    return JSONResponse({"queue": queue, "paused": False})
