"""Periodic schedules: list them (read), run one now, pause and resume one (admin)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from outboxq.api.auth import scoped
from outboxq.api.deps import PoolDep, transaction
from outboxq.api.errors import error_responses
from outboxq.api.routing import OutboxqRoute
from outboxq.api.schemas import KEY_PATTERN, JobPublic, ScheduleList, SchedulePublic, job_public
from outboxq.queue import schedules

router = APIRouter(tags=["schedules"], route_class=OutboxqRoute)

ScheduleName = Annotated[str, Path(min_length=1, max_length=255, pattern=KEY_PATTERN)]


@router.get("/v1/schedules", response_model=ScheduleList, **scoped("read"), responses=error_responses(401, 403))
def list_schedules(pool: PoolDep) -> JSONResponse:
    """Every schedule the workers stored: cron or interval, time zone, missed policy, last and next slot, paused."""
    with transaction(pool) as conn:
        return JSONResponse({"items": jsonable_encoder(schedules.list_schedules(conn))})


@router.post("/v1/schedules/{name}/run", status_code=201, response_model=JobPublic, **scoped("admin"),
             responses=error_responses(401, 403, 404, 422))
def run_schedule(name: ScheduleName, pool: PoolDep) -> JSONResponse:
    """Enqueue one job of the schedule now; its key (periodic:{name}:manual:...) never collides with a slot's."""
    with transaction(pool) as conn:
        job = schedules.run_now(conn, name)
    return JSONResponse(job_public(job), status_code=201)


def _paused(name: str, pool: PoolDep, paused: bool) -> JSONResponse:
    with transaction(pool) as conn:
        schedules.set_paused(conn, name, paused)
        return JSONResponse(jsonable_encoder(schedules.get_schedule(conn, name)))


@router.post("/v1/schedules/{name}/pause", response_model=SchedulePublic, **scoped("admin"),
             responses=error_responses(401, 403, 404, 422))
def pause_schedule(name: ScheduleName, pool: PoolDep) -> JSONResponse:
    """Pause the schedule: no slot is enqueued until it is resumed."""
    return _paused(name, pool, True)


@router.post("/v1/schedules/{name}/resume", response_model=SchedulePublic, **scoped("admin"),
             responses=error_responses(401, 403, 404, 422))
def resume_schedule(name: ScheduleName, pool: PoolDep) -> JSONResponse:
    """Resume the schedule; the slots passed while it was paused follow its missed policy."""
    return _paused(name, pool, False)
