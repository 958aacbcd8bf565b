"""The operators' view of periodic schedules: list them, run one now by hand, pause and resume one.

A job run by hand has the key `periodic:{name}:manual:{time}:{random}`: it never collides with a slot's job
(`periodic:{name}:{slot}`), so the schedule's own next slot still runs.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from outboxq.errors import ScheduleNotFound
from outboxq.queue.admin import statement_rows
from outboxq.queue.enqueue import enqueue
from outboxq.queue.jobs import Job
from outboxq.queue.sql import schedules as schedules_sql


def _public(row: dict[str, Any]) -> dict[str, Any]:
    kind, _, value = row["spec"].partition(":")
    return {"name": row["name"], "queue": row["queue"], "cron": value if kind == "cron" else None,
            "every_s": float(value) if kind == "every" else None, "timezone": row["timezone"],
            "missed": row["missed"], "last_slot": row["last_slot"], "next_slot": row["next_slot"],
            "last_job_id": row["last_job_id"], "last_job_status": row["last_job_status"], "paused": row["paused"]}


def list_schedules(conn: Any) -> list[dict[str, Any]]:
    """Every stored schedule: name, queue, cron or every_s, time zone, missed policy, last and next slot, the
    last slot's job and its status, paused."""
    return [_public(r) for r in statement_rows(conn, schedules_sql.schedule_list, {"name": None})]


def get_schedule(conn: Any, name: str) -> dict[str, Any]:
    """One stored schedule, as list_schedules gives it; ScheduleNotFound when none has that name."""
    found = statement_rows(conn, schedules_sql.schedule_list, {"name": name})
    if not found:
        raise ScheduleNotFound(f"no schedule is named {name!r}")
    return _public(found[0])


def run_now(conn: Any, name: str) -> Job:
    """Enqueue one job of the schedule now, in `conn`'s transaction (its key says it was run by hand)."""
    found = statement_rows(conn, schedules_sql.schedule_payload, {"name": name})
    if not found:
        raise ScheduleNotFound(f"no schedule is named {name!r}")
    key = f"periodic:{name}:manual:{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}:{uuid.uuid4().hex[:8]}"
    return enqueue(conn, found[0]["queue"], found[0]["payload"], key=key)


def set_paused(conn: Any, name: str, paused: bool) -> None:
    """Pause (no slot is enqueued) or resume (the missed policy decides about the slots passed meanwhile)."""
    if not statement_rows(conn, schedules_sql.schedule_set_paused, {"name": name, "paused": paused}):
        raise ScheduleNotFound(f"no schedule is named {name!r}")
