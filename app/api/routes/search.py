"""The operators' search across queues (read) and the bulk actions over a selection or a filter (admin)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse
from pydantic import AwareDatetime

from outboxq.api.auth import scoped
from outboxq.api.deps import PoolDep, transaction
from outboxq.api.errors import error_responses
from outboxq.api.routing import OutboxqRoute
from outboxq.api.schemas import (
    KEY_PATTERN,
    QUEUE_PATTERN,
    BulkAction,
    BulkByFilter,
    BulkByIds,
    BulkCount,
    JobCount,
    JobSearchPage,
    job_public,
)
from outboxq.errors import InvalidFilter
from outboxq.queue import search
from outboxq.queue.jobs import JobStatus

router = APIRouter(tags=["operations"], route_class=OutboxqRoute)


def job_filter_query(
    queue: Annotated[str | None, Query(pattern=QUEUE_PATTERN)] = None,
    status: Annotated[list[JobStatus] | None, Query(description="One or more statuses")] = None,
    key: Annotated[str | None, Query(min_length=1, max_length=255, pattern=KEY_PATTERN,
                                     description="A key prefix")] = None,
    payload: Annotated[str | None, Query(max_length=4096, description="A JSON object the payloads contain, e.g. "
                                                                       '{"customer": "acme"}')] = None,
    error: Annotated[str | None, Query(min_length=1, max_length=255, pattern=KEY_PATTERN,
                                       description="Text in the last error, any case")] = None,
    since: Annotated[AwareDatetime | None, Query(description="Created at or after (RFC 3339)")] = None,
    until: Annotated[AwareDatetime | None, Query(description="Created before (RFC 3339)")] = None,
) -> search.JobFilter:
    """The search filters of GET /v1/jobs and /v1/jobs/count, from the query string."""
    return search.JobFilter(queue=queue, statuses=tuple(s.value for s in status or ()), key=key,
                            payload=_payload_object(payload), error=error, since=since, until=until)


JobFilterQuery = Annotated[search.JobFilter, Depends(job_filter_query)]


@router.get("/v1/jobs", response_model=JobSearchPage, **scoped("read"), responses=error_responses(401, 403, 422))
def search_jobs(
    pool: PoolDep,
    job_filter: JobFilterQuery,
    limit: Annotated[int, Query(ge=1, le=search.MAX_PAGE)] = 50,
    marker: Annotated[str | None, Query(pattern="^[1-9][0-9]{0,18}$",
                                        description="next_marker of the previous page")] = None,
) -> JSONResponse:
    """Jobs of every queue, newest first, matching every filter given. Filters on queue, status, key and time
    look through the newest 1,000,000 jobs; a payload or error search through the newest 100,000."""
    with transaction(pool) as conn:
        page = search.search_jobs(conn, job_filter, limit=limit, marker=marker)
    return JSONResponse({"items": [job_public(j, result=False) for j in page.jobs], "next_marker": page.next_marker})


@router.get("/v1/jobs/count", response_model=JobCount, **scoped("read"), responses=error_responses(401, 403, 422))
def count_jobs(pool: PoolDep, job_filter: JobFilterQuery) -> JSONResponse:
    """How many jobs match the filters of GET /v1/jobs (in the same windows), counted up to 10,000 (what one
    bulk action by filter changes): {"count": n, "more": true} when there are more."""
    with transaction(pool) as conn:
        count, more = search.count_jobs(conn, job_filter)
    return JSONResponse({"count": count, "more": more})


def _payload_object(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise InvalidFilter('payload must be a JSON object, e.g. {"customer": "acme"}')
    return value


def _bulk(action: Any, body: BulkAction, pool: Any) -> JSONResponse:
    ids = body.ids if isinstance(body, BulkByIds) else None
    job_filter = None
    if isinstance(body, BulkByFilter):
        f = body.filter
        job_filter = search.JobFilter(queue=f.queue, statuses=tuple(f.status), key=f.key, payload=f.payload,
                                      error=f.error, since=f.since, until=f.until)
        if job_filter.empty and not body.all:
            raise InvalidFilter('an empty filter matches every job: add "all": true to mean it')
    with transaction(pool) as conn:
        count = action(conn, ids=ids, job_filter=job_filter)
    return JSONResponse({"count": count})


@router.post("/v1/jobs/retry", response_model=BulkCount, **scoped("admin"),
             responses=error_responses(400, 401, 403, 422))
def retry_jobs(body: BulkAction, pool: PoolDep) -> JSONResponse:
    """Run again now the retrying, dead and cancelled jobs among `ids`, or matching `filter` (at most 10,000 a
    call); how many."""
    return _bulk(search.bulk_retry, body, pool)


@router.post("/v1/jobs/cancel", response_model=BulkCount, **scoped("admin"),
             responses=error_responses(400, 401, 403, 422))
def cancel_jobs(body: BulkAction, pool: PoolDep) -> JSONResponse:
    """Cancel the unfinished (and dead) jobs among `ids`, or matching `filter` (at most 10,000 a call); running
    ones are asked to stop. How many."""
    return _bulk(search.bulk_cancel, body, pool)
