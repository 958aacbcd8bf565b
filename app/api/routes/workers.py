"""Workers: the live worker processes (the registry each worker refreshes from its heartbeat); and what the
calling token may do (GET /v1/me)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from outboxq.api.auth import Principal, require, scoped
from outboxq.api.deps import PoolDep, SettingsDep, transaction
from outboxq.api.errors import error_responses
from outboxq.api.routing import OutboxqRoute
from outboxq.api.schemas import TokenScopes, WorkerList
from outboxq.queue import admin

router = APIRouter(tags=["workers"], route_class=OutboxqRoute)


@router.get("/v1/workers", response_model=WorkerList, **scoped("read"), responses=error_responses(401, 403))
def list_workers(pool: PoolDep, settings: SettingsDep) -> JSONResponse:
    """Every worker process seen within worker_lapse_s (30 s by default): host, pid, version, queues and limits,
    concurrency, jobs in flight, started and last seen."""
    with transaction(pool) as conn:
        workers = admin.live_workers(conn, lapse_s=settings.worker_lapse_s)
    return JSONResponse({"items": jsonable_encoder(workers)})


@router.get("/v1/me", response_model=TokenScopes, openapi_extra={"x-required-scope": "read"},
            responses=error_responses(401, 403))
def read_my_scopes(principal: Annotated[Principal, Depends(require("read"))]) -> JSONResponse:
    """The scopes of the token that calls (admin implies the others)."""
    return JSONResponse({"scopes": sorted(principal.scopes)})
