"""Statistics over finished jobs: retries and processing time."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from outboxq.api.auth import scoped
from outboxq.api.deps import PoolDep, transaction
from outboxq.api.errors import error_responses
from outboxq.api.routing import OutboxqRoute
from outboxq.api.schemas import QUEUE_PATTERN, StatsList
from outboxq.queue import admin
from outboxq.queue.admin import MAX_STATS_AGE_DAYS

router = APIRouter(tags=["stats"], route_class=OutboxqRoute)

AgeDays = Annotated[float, Query(gt=0, le=MAX_STATS_AGE_DAYS, allow_inf_nan=False,
                                 description=f"Window, in days (at most {MAX_STATS_AGE_DAYS})")]
QueueFilter = Annotated[str | None, Query(pattern=QUEUE_PATTERN, description="Only this queue")]


def _json(rows: list[dict[str, Any]]) -> JSONResponse:
    return JSONResponse({"items": jsonable_encoder(rows)})


@router.get("/v1/stats/retries", response_model=StatsList, **scoped("read"),
            responses=error_responses(401, 403, 422))
def retry_statistics(pool: PoolDep, age_days: AgeDays = 1.0, queue: QueueFilter = None) -> JSONResponse:
    """Per queue over the window: jobs ok at the first attempt, retries, dead, and the retry percentage."""
    with transaction(pool) as conn:
        return _json(admin.retry_stats(conn, age_days=age_days, queue=queue))


@router.get("/v1/stats/processing-time", response_model=StatsList, **scoped("read"),
            responses=error_responses(401, 403, 422))
def processing_time_statistics(pool: PoolDep, age_days: AgeDays = 1.0,
                               queue: QueueFilter = None) -> JSONResponse:
    """Per queue over the window: avg, min, max, p50, p90, p95, p99 processing time of successful attempts (ms)."""
    with transaction(pool) as conn:
        return _json(admin.processing_time_stats(conn, age_days=age_days, queue=queue))


@router.get("/v1/stats/throughput", response_model=StatsList, **scoped("read"),
            responses=error_responses(401, 403, 422))
def throughput_statistics(pool: PoolDep, minutes: Annotated[int, Query(ge=1, le=1440)] = 60,
                          queue: QueueFilter = None) -> JSONResponse:
    """Per minute over the last `minutes`: jobs done and attempts failed (the dashboard's chart)."""
    with transaction(pool) as conn:
        return _json(admin.throughput(conn, minutes=minutes, queue=queue))
