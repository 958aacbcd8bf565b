"""Prometheus text exposition, computed from the database (counts only: never a payload)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials

from outboxq.api.auth import check
from outboxq.api.deps import PoolDep, transaction
from outboxq.api.errors import error_responses
from outboxq.api.routing import OutboxqRoute, api_state
from outboxq.queue import admin

router = APIRouter(tags=["metrics"], route_class=OutboxqRoute)

HISTOGRAM_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

# Read-only statements of the metrics endpoint (kept here, next to the only code that reads them).
metrics_failures = """
SELECT j.queue, count(*) AS failed,
       count(*) FILTER (WHERE e.error LIKE 'lease expired:%%') AS rescued
FROM outboxq_job_errors e JOIN outboxq_jobs j ON j.id = e.job_id
GROUP BY j.queue ORDER BY j.queue
"""
_bucket_columns = ",\n       ".join(
    f"count(*) FILTER (WHERE s <= {b}) AS le_{i}" for i, b in enumerate(HISTOGRAM_BUCKETS_S)
)
metrics_processing_time = f"""
SELECT queue, count(*) AS count, coalesce(sum(s), 0) AS sum,
       {_bucket_columns}
FROM (SELECT queue, extract(epoch FROM finished_at - attempt_started_at)::float8 AS s
      FROM outboxq_jobs WHERE status = 'done' AND attempt_started_at IS NOT NULL) t
GROUP BY queue ORDER BY queue
"""


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, labels: dict[str, Any], value: float) -> None:
        text = ",".join(f'{k}="{_label(str(v))}"' for k, v in labels.items())
        self.lines.append(f"{name}{{{text}}} {float(value):g}" if text else f"{name} {float(value):g}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@router.get("/metrics", response_class=PlainTextResponse, responses=error_responses(401, 403),
            openapi_extra={"x-required-scope": "none (or read when metrics_public is false)"})
def metrics(request: Request, pool: PoolDep) -> PlainTextResponse:
    """Prometheus metrics: jobs per queue and status, depth, failures, rescues, processing-time histogram."""
    if not api_state(request).settings.metrics_public:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        credentials = HTTPAuthorizationCredentials(scheme=scheme, credentials=token.strip()) if header else None
        check(request, credentials, "read")
    with transaction(pool) as conn:
        queues = admin.queue_counts(conn)
        failures = conn.execute(metrics_failures).fetchall()
        durations = conn.execute(metrics_processing_time).fetchall()
    out = _Exposition()
    out.family("outboxq_jobs", "gauge", "Jobs stored, by queue and status (finished jobs until pruned).")
    for q in queues:
        for status, n in q.counts.items():
            out.sample("outboxq_jobs", {"queue": q.queue, "status": status}, n)
    out.family("outboxq_jobs_enqueued", "gauge", "Jobs stored per queue, every status (enqueued, not yet pruned).")
    for q in queues:
        out.sample("outboxq_jobs_enqueued", {"queue": q.queue}, sum(q.counts.values()))
    out.family("outboxq_jobs_completed", "gauge", "Jobs done per queue (until pruned).")
    for q in queues:
        out.sample("outboxq_jobs_completed", {"queue": q.queue}, q.counts.get("done", 0))
    out.family("outboxq_queue_depth", "gauge", "Jobs waiting to run per queue (queued + retrying).")
    for q in queues:
        out.sample("outboxq_queue_depth", {"queue": q.queue}, q.counts.get("queued", 0) + q.counts.get("retrying", 0))
    out.family("outboxq_queue_paused", "gauge", "1 when the queue is paused.")
    for q in queues:
        out.sample("outboxq_queue_paused", {"queue": q.queue}, 1 if q.paused else 0)
    out.family("outboxq_job_attempts_failed", "gauge", "Failed attempts recorded per queue (until pruned).")
    for r in failures:
        out.sample("outboxq_job_attempts_failed", {"queue": r["queue"]}, r["failed"])
    out.family("outboxq_jobs_rescued", "gauge", "Attempts whose lease expired and were rescued, per queue.")
    for r in failures:
        out.sample("outboxq_jobs_rescued", {"queue": r["queue"]}, r["rescued"])
    out.family("outboxq_processing_seconds", "histogram", "Processing time of successful attempts (done jobs).")
    for r in durations:
        for i, bound in enumerate(HISTOGRAM_BUCKETS_S):
            out.sample("outboxq_processing_seconds_bucket", {"queue": r["queue"], "le": f"{bound:g}"}, r[f"le_{i}"])
        out.sample("outboxq_processing_seconds_bucket", {"queue": r["queue"], "le": "+Inf"}, r["count"])
        out.sample("outboxq_processing_seconds_sum", {"queue": r["queue"]}, r["sum"])
        out.sample("outboxq_processing_seconds_count", {"queue": r["queue"]}, r["count"])
    return PlainTextResponse(out.text(), media_type="text/plain; version=0.0.4; charset=utf-8")
