"""The operators' search across queues and the bulk actions over a selection or a filter (the dashboard's
search box and bulk buttons, GET /v1/jobs, POST /v1/jobs/retry and /v1/jobs/cancel).

Every search reads a bounded window of the newest jobs, so that it answers fast beside any history: filters on
queue, status, key and time look through the newest WINDOW jobs (by id); a search in payloads or error texts,
which reads every row it passes, through the newest CONTENT_WINDOW. A bulk action over a filter changes at
most BULK_MAX jobs per call (call again for more: each call says how many it changed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outboxq.errors import InvalidInput, InvalidMarker
from outboxq.queue import sql
from outboxq.queue.enqueue import Statement, _run_plan, _stored_job, validate_queue_name
from outboxq.queue.jobs import Job, JobStatus

WINDOW = 1_000_000
CONTENT_WINDOW = 100_000
BULK_MAX = 10_000
MAX_PAGE = 1000


@dataclass(frozen=True)
class JobFilter:
    """Which jobs: every field optional; `statuses` any of several; `key` a prefix; `payload` a JSON object the
    payload contains; `error` text in the last error (any case); `since`/`until` bound created_at."""

    queue: str | None = None
    statuses: tuple[str, ...] = ()
    key: str | None = None
    payload: dict[str, Any] | None = None
    error: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        if self.queue is not None:
            validate_queue_name(self.queue)
        unknown = [s for s in self.statuses if s not in {v.value for v in JobStatus}]
        if unknown:
            raise InvalidInput(f"unknown status {unknown[0]!r}: use {', '.join(s.value for s in JobStatus)}")
        if self.payload is not None and not isinstance(self.payload, dict):
            raise InvalidInput("payload must be a JSON object that the jobs' payloads contain")
        for name in ("key", "error"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value or "\x00" in value or len(value) > 255):
                raise InvalidInput(f"{name} must be 1 to 255 characters without NUL")

    @property
    def empty(self) -> bool:
        """True when no field is set: the filter matches every job."""
        return self == JobFilter()

    def params(self, newest_id: int) -> dict[str, Any]:
        """The statement parameters: the filter's fields, and the floor of its search window."""
        content = self.payload is not None or self.error is not None
        return {"queue": self.queue, "statuses": list(self.statuses) or None, "key_prefix": self.key,
                "payload": json.dumps(self.payload) if self.payload is not None else None, "error": self.error,
                "since": self.since, "until": self.until,
                "floor": max(0, newest_id - (CONTENT_WINDOW if content else WINDOW))}


@dataclass(frozen=True)
class SearchPage:
    """Jobs newest first, and the marker of the next page (None when this one was the last)."""

    jobs: list[Job]
    next_marker: str | None


def search_jobs(conn: Any, job_filter: JobFilter, *, limit: int = 50, marker: str | None = None) -> SearchPage:
    """One page of the jobs matching the filter, newest first, without their results."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"limit must be an integer from 1 to {MAX_PAGE}")
    before = _marker_id(marker)

    def plan() -> Any:
        newest = yield Statement(sql.job_newest_id, {}, rows="one")
        rows = yield Statement(sql.job_search, {**job_filter.params(newest["id"]), "before": before,
                                                "limit": limit})
        return [_stored_job(r) for r in rows]
    jobs = _run_plan(conn, plan())
    return SearchPage(jobs, str(jobs[-1].id) if len(jobs) == limit else None)


def count_jobs(conn: Any, job_filter: JobFilter) -> tuple[int, bool]:
    """How many jobs match the filter (in its search window), counted up to BULK_MAX, and whether there are
    more: what a bulk action by this filter would change at most, for its confirmation."""

    def plan() -> Any:
        newest = yield Statement(sql.job_newest_id, {}, rows="one")
        row = yield Statement(sql.job_search_count, {**job_filter.params(newest["id"]), "before": None,
                                                     "limit": BULK_MAX + 1}, rows="one")
        return int(row["n"])

    counted = _run_plan(conn, plan())
    return min(counted, BULK_MAX), counted > BULK_MAX


def _marker_id(marker: str | None) -> int | None:
    if marker is None:
        return None
    if not marker.isascii() or not marker.isdigit() or not 0 < int(marker) < 2**63:
        raise InvalidMarker(f"invalid marker {marker[:40]!r}: pass next_marker of the previous page")
    return int(marker)


def bulk_retry(conn: Any, *, ids: list[int] | None = None, job_filter: JobFilter | None = None) -> int:
    """Run again now the retrying, dead and cancelled jobs among `ids`, or matching the filter (at most
    BULK_MAX); how many. Not committed here."""
    return _bulk(conn, sql.job_bulk_retry, ids, job_filter)


def bulk_cancel(conn: Any, *, ids: list[int] | None = None, job_filter: JobFilter | None = None) -> int:
    """Cancel the unfinished (and dead) jobs among `ids`, or matching the filter (at most BULK_MAX); running
    ones are asked to stop. How many. Not committed here."""
    return _bulk(conn, sql.job_bulk_cancel, ids, job_filter)


def _bulk(conn: Any, statement: str, ids: list[int] | None, job_filter: JobFilter | None) -> int:
    if (ids is None) == (job_filter is None):
        raise InvalidInput("give either ids or a filter")
    if ids is not None and (len(ids) > BULK_MAX or not all(isinstance(i, int) and 0 < i < 2**63 for i in ids)):
        raise InvalidInput(f"ids must be at most {BULK_MAX} job ids")

    def plan() -> Any:
        newest = yield Statement(sql.job_newest_id, {}, rows="one")
        chosen = (job_filter or JobFilter()).params(newest["id"])
        row = yield Statement(statement, {**chosen, "ids": ids, "before": None, "limit": BULK_MAX}, rows="one")
        return int(row["count"])
    return _run_plan(conn, plan())
