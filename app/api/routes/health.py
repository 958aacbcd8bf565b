"""Liveness, readiness (database and schema) and queue health."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from outboxq.api.auth import scoped
from outboxq.api.deps import PoolDep, transaction
from outboxq.api.errors import error_json, error_responses
from outboxq.api.routing import OutboxqRoute, api_state
from outboxq.api.schemas import Health, Liveness, Readiness
from outboxq.queue.migrate import head_revision, revision_on

router = APIRouter(tags=["health"], route_class=OutboxqRoute)

READINESS_TIMEOUT_S = 2.0


@router.get("/healthz", response_model=Liveness)
def liveness() -> JSONResponse:
    """The process is alive (no database access)."""
    return JSONResponse({"status": "ok"})


@router.get("/readyz", response_model=Readiness, responses=error_responses())
def readiness(request: Request) -> JSONResponse:
    """Ready when the database answers and its schema is current; 503 otherwise."""
    pool = api_state(request).pool
    try:
        if pool is None:  # the router's lifespan has not opened it (yet)
            raise RuntimeError("no connection pool")
        with pool.connection(timeout=READINESS_TIMEOUT_S) as conn:
            revision = revision_on(conn)
    except Exception as exc:  # any failure to reach the database means: not ready
        return error_json(503, "database_unavailable", f"the database does not answer ({type(exc).__name__})",
                          {"Retry-After": "1"})
    if revision != head_revision():
        return error_json(503, "schema_out_of_date",
                          f"the schema is at {revision or 'nothing'} but this outboxq needs {head_revision()}: "
                          "run `outboxq migrate`")
    return JSONResponse({"ready": True, "schema_revision": revision})


@router.get("/v1/health", response_model=Health, **scoped("read"), responses=error_responses(401, 403))
def queue_health(request: Request, pool: PoolDep) -> JSONResponse:
    """Healthy, or which queues have been in error for too long and since when."""
    with transaction(pool) as conn:
        report = api_state(request).health_monitor.check(conn)
    return JSONResponse(report)
