"""Operations on jobs and queues, used by the CLI and the HTTP API: errors, retry, cancel, pause, stats, health."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg.rows import dict_row

from outboxq.errors import InvalidInput, InvalidTransition, JobNotFound
from outboxq.queue import sql
from outboxq.queue.enqueue import get_job, psycopg_connection, validate_queue_name
from outboxq.queue.jobs import Job, JobStatus
from outboxq.settings import get_settings


def statement_rows(conn: Any, statement: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Run one statement on any connection enqueue accepts (in its transaction, outboxq's tables named in
    OUTBOXQ_SCHEMA as enqueue names them); its rows as dicts, [] for none."""
    with psycopg_connection(conn).cursor(row_factory=dict_row) as cur:
        cur.execute(sql.qualified(statement, get_settings().db_schema), params)
        return cur.fetchall() if cur.description else []


def list_errors(conn: Any, queue: str, *, limit: int = 100) -> list[Job]:
    """Jobs of `queue` in `retrying` or `dead`, with their last error, oldest first."""
    validate_queue_name(queue)
    return [Job.from_row(r) for r in statement_rows(conn, sql.queue_list_errors, {"queue": queue, "limit": limit})]


def error_history(conn: Any, job_id: int) -> list[dict[str, Any]]:
    """Every failed attempt of a job: attempt, error, traceback, failed_at."""
    return statement_rows(conn, sql.job_error_history, {"id": job_id})


def retry_job(conn: Any, job_id: int) -> Job:
    """Run a retrying, dead or cancelled job again now, whatever its attempts."""
    if not statement_rows(conn, sql.job_retry_now, {"id": job_id}):
        job = get_job(conn, job_id)
        if job is None:
            raise JobNotFound(job_id)
        raise InvalidTransition(
            f"job {job_id} is {job.status.value}; only retrying, dead or cancelled jobs can be retried"
        )
    job = get_job(conn, job_id)
    assert job is not None
    return job


def retry_queue(conn: Any, queue: str) -> int:
    """Run every retrying and dead job of `queue` again now; returns how many."""
    validate_queue_name(queue)
    rows = statement_rows(conn, sql.queue_retry_all_now, {"queue": queue})
    return int(rows[0]["retried"]) if rows else 0


def cancel_job(conn: Any, job_id: int) -> Job:
    """Cancel a queued, waiting or retrying job; ask a running one to stop (its handler sees ctx.cancelled); a
    dead one becomes cancelled (which lets the next job of its sequence run)."""
    if not statement_rows(conn, sql.job_cancel, {"id": job_id}):
        job = get_job(conn, job_id)
        if job is None:
            raise JobNotFound(job_id)
        raise InvalidTransition(f"job {job_id} is {job.status.value} and can no longer be cancelled")
    job = get_job(conn, job_id)
    assert job is not None
    return job


def set_paused(conn: Any, queue: str, paused: bool) -> None:
    """Pause (workers stop claiming from it) or resume a queue; the state is stored, so it survives restarts."""
    validate_queue_name(queue)
    statement_rows(conn, sql.queue_set_paused, {"queue": queue, "paused": paused})


def pause_queue(conn: Any, queue: str) -> None:
    """Pause a queue."""
    set_paused(conn, queue, True)


def resume_queue(conn: Any, queue: str) -> None:
    """Resume a paused queue."""
    set_paused(conn, queue, False)


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue's job counts per status, and whether it is paused or failing."""

    queue: str
    paused: bool
    failing_since: datetime | None
    counts: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values."""
        return {
            "queue": self.queue,
            "paused": self.paused,
            "failing_since": self.failing_since.isoformat() if self.failing_since else None,
            "counts": self.counts,
        }


# The finished counts of queue_counts() cover this window: beside millions of finished jobs, counting all of
# them on every listing would cost what the history costs.
FINISHED_COUNTS_WINDOW_S = 24 * 3600.0
# The stats' windows (age_days) are at most this long, for the same reason.
MAX_STATS_AGE_DAYS = 7


def queue_counts(conn: Any, queue: str | None = None) -> list[QueueInfo]:
    """Every known queue (or only `queue`, when it is known) with its counts per status (every status present,
    zero when none): unfinished jobs all, finished ones (done, dead, cancelled) those of the last
    FINISHED_COUNTS_WINDOW_S seconds."""
    out = []
    statement = sql.queue_counts if queue is None else sql.queue_counts_one
    for r in statement_rows(conn, statement, {"finished_window_s": FINISHED_COUNTS_WINDOW_S, "queue": queue}):
        counts = {s.value: 0 for s in JobStatus}
        counts.update({k: int(v) for k, v in (r["counts"] or {}).items()})
        out.append(QueueInfo(r["queue"], r["paused"], r["failing_since"], counts))
    return out


QUEUE_STATES = ("paused", "failing", "limited", "idle", "running")


def queue_state(queue: dict[str, Any]) -> str:
    """What a queue is doing, from its listing (queue_counts' to_dict() with its "limits" usage, or None):
    paused; failing (its last attempts failed: it is backing off); limited (a concurrency or rate limit binds
    now: every slot taken, or the window's starts used up); idle (nothing to run); else running."""
    if queue["paused"]:
        return "paused"
    if queue["failing_since"] is not None:
        return "failing"
    limits = queue.get("limits")
    if limits:
        busiest = max([k["running"] for k in limits["busiest_keys"]], default=0) if limits["per_key"] \
            else limits["running"]
        full = limits["global_concurrency"] is not None and busiest >= limits["global_concurrency"]
        rate = limits["rate_limit"]
        spent = rate is not None and limits["recent_starts"] >= int(rate.split("/")[0])
        if full or spent:
            return "limited"
    counts = queue["counts"]
    return "running" if counts.get("queued", 0) + counts.get("running", 0) + counts.get("retrying", 0) else "idle"


def _since(age_days: float, now: datetime | None) -> datetime:
    if not 0 < age_days <= MAX_STATS_AGE_DAYS:  # (nan fails too)
        raise InvalidInput(f"age_days must be more than 0 and at most {MAX_STATS_AGE_DAYS} (the stats read a "
                           f"window of history, never all of it), not {age_days!r}")
    return (now or datetime.now(UTC)) - timedelta(days=age_days)


def retry_stats(conn: Any, *, age_days: float = 1.0, queue: str | None = None,
                now: datetime | None = None) -> list[dict[str, Any]]:
    """Per queue, over jobs finished in the last `age_days`: ok, retries, dead, and the retry percentage."""
    if queue is not None:
        validate_queue_name(queue)
    rows = statement_rows(conn, sql.stats_retries, {"since": _since(age_days, now), "queue": queue})
    for r in rows:
        attempts = int(r["ok"]) + int(r["dead"]) + int(r["retries"])
        r["retry_percentage"] = round(100.0 * int(r["retries"]) / attempts, 2) if attempts else 0.0
    return rows


def processing_time_stats(conn: Any, *, age_days: float = 1.0, queue: str | None = None,
                          now: datetime | None = None) -> list[dict[str, Any]]:
    """Per queue: avg, min, max, p50, p90, p95, p99 of the successful attempts' processing time, in ms."""
    if queue is not None:
        validate_queue_name(queue)
    rows = statement_rows(conn, sql.stats_processing_time, {"since": _since(age_days, now), "queue": queue})
    return [{k: (float(v) if k.endswith("_ms") and v is not None else v) for k, v in r.items()} for r in rows]


@dataclass
class HealthMonitor:
    """Queue health: unhealthy when a queue has been in error longer than the allowed time.

    Within `startup_grace_s` of start-up the system is reported healthy (a restart after an outage is not
    itself an alarm). `on_error` and `on_recovered` are called when the whole system goes into and out of
    error.
    """

    healthy_allowed_error_time_s: float = 15 * 60.0
    startup_grace_s: float = 60.0
    on_error: Callable[[dict[str, Any]], None] | None = None
    on_recovered: Callable[[dict[str, Any]], None] | None = None
    started_at: float = field(default_factory=time.monotonic)
    _was_healthy: bool = True

    def check(self, conn: Any, *, now: datetime | None = None, monotonic_now: float | None = None) -> dict[str, Any]:
        """{"healthy": bool, "queues_in_error": [{"queue", "failing_since", "consecutive_failures"}]}."""
        now = now or datetime.now(UTC)
        in_grace = ((monotonic_now or time.monotonic()) - self.started_at) < self.startup_grace_s
        failing = statement_rows(conn, sql.queue_failing, {})
        too_long = [
            r for r in failing
            if (now - r["failing_since"]).total_seconds() > self.healthy_allowed_error_time_s
        ]
        report = {
            "healthy": in_grace or not too_long,
            "in_startup_grace": in_grace,
            "queues_in_error": [
                {"queue": r["queue"], "failing_since": r["failing_since"].isoformat(),
                 "consecutive_failures": r["consecutive_failures"]}
                for r in (too_long if not in_grace else [])
            ],
        }
        if self._was_healthy and not report["healthy"] and self.on_error:
            self.on_error(report)
        if not self._was_healthy and report["healthy"] and self.on_recovered:
            self.on_recovered(report)
        self._was_healthy = bool(report["healthy"])
        return report


def throughput(conn: Any, *, minutes: int = 60, queue: str | None = None,
               now: datetime | None = None) -> list[dict[str, Any]]:
    """Per minute over the last `minutes`: jobs done and attempts failed (every minute present)."""
    if queue is not None:
        validate_queue_name(queue)
    rows = statement_rows(conn, sql.stats_throughput,
                 {"now": now or datetime.now(UTC), "minutes": minutes, "queue": queue})
    return [{"minute": r["minute"].isoformat(), "done": int(r["done"]), "failed": int(r["failed"])} for r in rows]


def job_dependencies(conn: Any, job_id: int) -> dict[str, list[dict[str, Any]]]:
    """{"depends_on": [...], "dependents": [...]}: id, queue, key, status of each related job."""
    out: dict[str, list[dict[str, Any]]] = {"depends_on": [], "dependents": []}
    for r in statement_rows(conn, sql.job_dependencies_of, {"id": job_id}):
        out[r.pop("direction")].append(r)
    return out


def live_workers(conn: Any, limit: int = 1000, lapse_s: float | None = None) -> list[dict[str, Any]]:
    """The worker processes seen within `lapse_s` (settings.worker_lapse_s unless given; each announces itself
    from its heartbeat): id, host, pid, version, queues (with their limits), concurrency, jobs in flight, started
    and last seen."""
    lapse_s = get_settings().worker_lapse_s if lapse_s is None else lapse_s
    return statement_rows(conn, sql.worker_list_live, {"lapse_s": lapse_s, "limit": limit})
