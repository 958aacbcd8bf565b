"""Spark batches: submit one over a queue, and read its state (spark_jobs.batches does the work)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from outboxq.api.auth import scoped
from outboxq.api.deps import PoolDep, SettingsDep, transaction
from outboxq.api.errors import ApiProblem, error_responses
from outboxq.api.routing import OutboxqRoute
from outboxq.api.schemas import SparkBatchCreate, SparkBatchCreated
from outboxq.db import one_row
from outboxq.queue.sql import spark as spark_sql
from outboxq.queue.sql import spark_stream as stream_sql

router = APIRouter(tags=["spark"], route_class=OutboxqRoute)

# What a submission refused for the batches at work is told to wait: batches take minutes.
BUSY_RETRY_AFTER_S = 30


def _batches() -> Any:
    try:
        from outboxq.spark_jobs import batches
    except ImportError as exc:  # the spark_jobs package is optional in an API-only deployment
        raise ApiProblem(503, "spark_unavailable", f"Spark batches are not available here ({exc})") from None
    return batches


@router.get("/v1/spark/batches", **scoped("read"), responses=error_responses(401, 403, 422))
def list_spark_batches(pool: PoolDep, limit: Annotated[int, Query(ge=1, le=500)] = 100) -> JSONResponse:
    """The latest Spark batches, newest first, with their state and counts."""
    with transaction(pool) as conn:
        rows = conn.execute(spark_sql.spark_batch_list, {"limit": limit}).fetchall()
    return JSONResponse({"items": jsonable_encoder([dict(r) for r in rows])})


@router.get("/v1/spark/streams", **scoped("read"), responses=error_responses(401, 403, 422))
def list_spark_streams(pool: PoolDep, limit: Annotated[int, Query(ge=1, le=500)] = 100) -> JSONResponse:
    """Spark streaming queries reading outboxq (format "outboxq"): running ones first, each with its Spark
    application id, host and pid, micro-batches, jobs read, lease renewals and its queue's ready jobs (lag)."""
    with transaction(pool) as conn:
        rows = conn.execute(stream_sql.spark_stream_list,
                            {"limit": limit, "lapse_s": stream_sql.STREAM_LAPSE_S}).fetchall()
    return JSONResponse({"items": jsonable_encoder([dict(r) for r in rows])})


@router.post("/v1/spark/batches", status_code=202, response_model=SparkBatchCreated, **scoped("admin"),
             responses=error_responses(400, 401, 403, 422))
def submit_spark_batch(body: SparkBatchCreate, pool: PoolDep, settings: SettingsDep) -> JSONResponse:
    """Submit a Spark batch: a registered processor over the queue's jobs into output_table; returns its id.
    429 while spark_max_batches run and spark_max_pending_batches already wait."""
    if body.master is not None:
        raise ApiProblem(422, "master_not_allowed", "a request cannot choose the Spark master: it comes from the "
                         "operator's settings (OUTBOXQ_SPARK_MASTER, OUTBOXQ_SPARK_CONF)")
    batches = _batches()
    with transaction(pool) as conn:
        # Each batch is a process waiting for its turn: their number is bounded, not the submitter's to grow.
        conn.execute(spark_sql.spark_batch_submit_lock)
        active = one_row(conn.execute(spark_sql.spark_batch_count_active))
        if active["running"] >= settings.spark_max_batches and active["pending"] >= settings.spark_max_pending_batches:
            raise ApiProblem(
                429, "too_many_spark_batches",
                f"{active['running']} Spark batches are running (spark_max_batches {settings.spark_max_batches}) "
                f"and {active['pending']} wait for their turn (spark_max_pending_batches "
                f"{settings.spark_max_pending_batches}); submit again once one has finished",
                {"Retry-After": str(BUSY_RETRY_AFTER_S)})
        batch_id = batches.submit_batch(conn, queue=body.queue, processor=body.processor,
                                        output_table=body.output_table, batch_size=body.batch_size,
                                        settings=settings)
    # Committed: the process finds its row (a launch before the commit could run a batch that rolled back).
    try:
        batches.launch_batch(batch_id, settings)
    except OSError as exc:
        with transaction(pool) as conn:
            batches.finish_batch(conn, batch_id, error=f"could not start the batch process: {exc}")
        raise ApiProblem(503, "spark_launch_failed", f"Spark batch {batch_id} could not start: {exc}") from None
    return JSONResponse({"id": int(batch_id)}, status_code=202)


@router.get("/v1/spark/batches/{batch_id}", **scoped("read"), responses=error_responses(401, 403, 404, 422))
def read_spark_batch(batch_id: int, pool: PoolDep) -> JSONResponse:
    """The state of a Spark batch: pending, running, done or failed, with its counts."""
    if not 1 <= batch_id < 2**63:
        raise ApiProblem(404, "batch_not_found", f"no Spark batch has id {batch_id}")
    batches = _batches()
    with transaction(pool) as conn:
        batch = batches.get_batch(conn, batch_id)
    if batch is None:
        raise ApiProblem(404, "batch_not_found", f"no Spark batch has id {batch_id}")
    return JSONResponse(jsonable_encoder(batch))
