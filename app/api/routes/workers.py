"""Workers: the live worker processes (the registry each worker refreshes from its heartbeat)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from outboxq.api.auth import scoped
from outboxq.api.deps import PoolDep, SettingsDep, transaction
from outboxq.api.errors import error_responses
from outboxq.api.routing import OutboxqRoute
from outboxq.api.schemas import WorkerList
from outboxq.queue import admin

router = APIRouter(tags=["workers"], route_class=OutboxqRoute)


@router.get("/v1/workers", response_model=WorkerList, **scoped("read"), responses=error_responses(401, 403))
def list_workers(pool: PoolDep, settings: SettingsDep) -> JSONResponse:
    """Every worker process seen within worker_lapse_s (30 s by default): host, pid, version, queues and limits,
    concurrency, jobs in flight, started and last seen."""
    with transaction(pool) as conn:
        workers = admin.live_workers(conn, lapse_s=settings.worker_lapse_s)
    return JSONResponse({"items": jsonable_encoder(workers)})
