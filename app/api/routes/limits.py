"""Flow control at run time: read a queue's limits and usage, change them, or go back to what its consumers
declare. Every worker applies a change within a few seconds (outboxq.queue.limits.LIMITS_REFRESH_S); it is
kept in PostgreSQL, so it survives restarts."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from outboxq.api.auth import scoped
from outboxq.api.deps import PoolDep, QueueName, transaction
from outboxq.api.errors import ApiProblem, error_responses
from outboxq.api.routing import OutboxqRoute
from outboxq.api.schemas import QueueLimitsChange, QueueLimitsPublic
from outboxq.errors import InvalidLimit
from outboxq.queue import limits

router = APIRouter(tags=["limits"], route_class=OutboxqRoute)


@router.get("/v1/queues/{queue}/limits", response_model=QueueLimitsPublic, **scoped("read"),
            responses=error_responses(401, 403, 404, 422))
def get_queue_limits(queue: QueueName, pool: PoolDep) -> JSONResponse:
    """The queue's limits and their usage now (404 when the queue has none)."""
    with transaction(pool) as conn:
        found = limits.usage(conn, queue)
    if not found:
        raise ApiProblem(404, "not_found", f"queue {queue!r} has no limits")
    return JSONResponse(found[0])


@router.put("/v1/queues/{queue}/limits", response_model=QueueLimitsPublic, **scoped("admin"),
            responses=error_responses(400, 401, 403, 422))
def set_queue_limits(queue: QueueName, change: QueueLimitsChange, pool: PoolDep) -> JSONResponse:
    """Change the queue's limits: each field given replaces its limit (null removes it); kept until reset."""
    given = change.model_fields_set
    if not given:
        raise InvalidLimit("give global_concurrency (an integer, or null for none) and/or rate_limit "
                           "('N/s', 'N/m', 'N/h', or null for none)")
    with transaction(pool) as conn:
        limits.set_limits(conn, queue, global_concurrency=change.global_concurrency, rate_limit=change.rate_limit,
                          set_concurrency="global_concurrency" in given, set_rate="rate_limit" in given)
        found = limits.usage(conn, queue)
    return JSONResponse(found[0])


@router.delete("/v1/queues/{queue}/limits", status_code=204, **scoped("admin"),
               responses=error_responses(401, 403, 404, 422))
def reset_queue_limits(queue: QueueName, pool: PoolDep) -> None:
    """Forget the limits set at run time: the queue's consumers' declarations apply again (as workers start)."""
    with transaction(pool) as conn:
        if not limits.reset_limits(conn, queue):
            raise ApiProblem(404, "not_found", f"queue {queue!r} has no limits")
