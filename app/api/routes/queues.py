"""Queues: their counts per status and limits, and their errored jobs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from outboxq.api.auth import scoped
from outboxq.api.deps import IncludeResult, PoolDep, QueueName, transaction
from outboxq.api.errors import error_responses
from outboxq.api.routing import OutboxqRoute
from outboxq.api.schemas import JobList, QueueList, QueueSummary, job_public
from outboxq.queue import admin, limits, sql
from outboxq.queue.jobs import JobStatus

router = APIRouter(tags=["queues"], route_class=OutboxqRoute)


@router.get("/v1/queues", response_model=QueueList, **scoped("read"), responses=error_responses(401, 403))
def list_queues(pool: PoolDep) -> JSONResponse:
    """Each queue with its job counts per status (finished ones over the last `finished_window_s` seconds),
    whether it is paused, its limits with their usage, and its state: paused, failing (its last attempts failed
    and it is backing off), limited (a limit binds now), idle or running."""
    with transaction(pool) as conn:
        queues = _listing(conn)
    return JSONResponse({"queues": queues, "finished_window_s": admin.FINISHED_COUNTS_WINDOW_S})


@router.get("/v1/queues/{queue}", response_model=QueueSummary, **scoped("read"),
            responses=error_responses(401, 403, 422))
def get_queue(queue: QueueName, pool: PoolDep) -> JSONResponse:
    """One queue as GET /v1/queues lists it, counted from its own jobs only (a queue's page asks this rather
    than the whole listing); a queue nobody has used yet answers with zero counts."""
    with transaction(pool) as conn:
        found = _listing(conn, queue)
    return JSONResponse(found[0] if found else _unused(queue, None) | {"state": "idle", "lag_s": 0.0})


def _listing(conn: Any, queue: str | None = None) -> list[dict[str, Any]]:
    """The queues' listing (or one queue's), each with its limits, state and lag, sorted by name."""
    queues = [q.to_dict() for q in admin.queue_counts(conn, queue)]
    usage = {u["queue"]: u for u in limits.usage(conn, queue)}
    lag_sql, params = (sql.metrics_queue_lag, None) if queue is None else (sql.queue_lag_one, {"queue": queue})
    lags = {r["queue"]: r["lag_s"] for r in conn.execute(lag_sql, params).fetchall()}
    for q in queues:
        q["limits"] = usage.pop(q["queue"], None)
    # A queue limited before any job of it was enqueued is listed too (no jobs yet).
    queues += [_unused(name, u) for name, u in usage.items()]
    for q in queues:
        q["state"] = admin.queue_state(q)
        q["lag_s"] = round(max(0.0, lags.get(q["queue"]) or 0.0), 3)
    return sorted(queues, key=lambda q: q["queue"])


def _unused(queue: str, usage: dict[str, Any] | None) -> dict[str, Any]:
    return {"queue": queue, "paused": False, "failing_since": None, "counts": {s.value: 0 for s in JobStatus},
            "limits": usage}


@router.get("/v1/queues/{queue}/errors", response_model=JobList, **scoped("read"),
            responses=error_responses(401, 403, 422))
def list_queue_errors(queue: QueueName, pool: PoolDep,
                      limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                      include: IncludeResult = None) -> JSONResponse:
    """The queue's jobs in retrying or dead, with their last error, oldest first (results with include=result)."""
    with transaction(pool) as conn:
        jobs = admin.list_errors(conn, queue, limit=limit)
    return JSONResponse({"items": [job_public(j, result=include == "result") for j in jobs]})
