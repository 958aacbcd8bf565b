"""periodic(): schedules defined next to a handler's @consumer, and the slots (scheduled times) they make.

A schedule is `cron` (5 fields, or 6 with a leading seconds field, evaluated in `timezone`) or `every` (a
timedelta; slots are whole multiples of it since the Unix epoch, so every worker computes the same ones
whenever it started). Workers enqueue one job per slot (workers/scheduler.py); the slot is claimed in
PostgreSQL, never in one process's memory.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from outboxq.errors import InvalidInput
from outboxq.queue.enqueue import validate_queue_name
from outboxq.registry import Registry, default_registry

MISSED_POLICIES = ("latest", "skip", "all")
# missed="all" after a long outage: at most this many of the newest missed slots are run.
MAX_CATCH_UP_SLOTS = 1000
# periodic() computes this many slots from now before it accepts a schedule: one that never fires (a cron
# expression of February 30th) or whose slots soon pass the last date Python holds (every= of 10,000 years)
# is refused at import, rather than failing in every worker's scheduler at run time.
CHECKED_SLOTS = 3
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Schedule:
    """A periodic schedule: which queue gets a job with `payload` at each slot, and what a missed slot does."""

    name: str
    queue: str
    cron: str | None = None
    every: timedelta | None = None
    payload: Any = None
    timezone: str = "UTC"
    missed: str = "latest"

    @property
    def spec(self) -> str:
        """How the database records the schedule ("cron:<expression>" or "every:<seconds>")."""
        return f"cron:{self.cron}" if self.cron is not None else f"every:{self.every.total_seconds():g}"  # type: ignore[union-attr]

    def next_after(self, moment: datetime) -> datetime:
        """The first slot strictly after `moment` (UTC)."""
        if self.every is not None:
            period = self.every.total_seconds()
            k = math.floor((moment - _EPOCH).total_seconds() / period) + 1
            return _EPOCH + timedelta(seconds=k * period)
        assert self.cron is not None  # periodic() gives a schedule exactly one of cron and every
        it = croniter(self.cron, moment.astimezone(ZoneInfo(self.timezone)),
                      second_at_beginning=len(self.cron.split()) == 6)
        return it.get_next(datetime).astimezone(UTC)

    def slots_between(self, first: datetime, last: datetime, limit: int = MAX_CATCH_UP_SLOTS) -> list[datetime]:
        """The slots s with first <= s <= last (`first` is itself a slot), oldest first; at most the newest
        `limit` of them."""
        if first > last:
            return []
        if self.every is not None:
            period = self.every.total_seconds()
            count = math.floor((last - first).total_seconds() / period) + 1
            skip = max(0, count - limit)
            return [first + timedelta(seconds=(skip + i) * period) for i in range(count - skip)]
        newest: list[datetime] = []
        assert self.cron is not None  # periodic() gives a schedule exactly one of cron and every
        it = croniter(self.cron, last.astimezone(ZoneInfo(self.timezone)) + timedelta(microseconds=1),
                      second_at_beginning=len(self.cron.split()) == 6, is_prev=True)
        while len(newest) < limit:
            slot = it.get_prev(datetime).astimezone(UTC)
            if slot < first:
                break
            newest.append(slot)
        return newest[::-1]


def slot_key(name: str, slot: datetime) -> str:
    """The job key of a schedule's slot: periodic:{name}:{YYYY-MM-DDTHH:MM:SSZ}."""
    return f"periodic:{name}:{slot.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


def periodic(queue: str, *, cron: str | None = None, every: timedelta | None = None, payload: Any = None,
             name: str | None = None, timezone: str = "UTC", missed: str = "latest",
             registry: Registry | None = None) -> Schedule:
    """Enqueue a job on `queue` at each slot of `cron` or `every`, once per slot across every worker.

    Call it at import of a handler module, next to the queue's @consumer. `missed` says what happens to slots
    that passed while no worker ran: "latest" runs the most recent one once, "skip" none, "all" each (the
    newest MAX_CATCH_UP_SLOTS). The job's key is periodic:{name}:{slot in UTC}; `name` defaults to the queue.
    The schedule goes to `registry` (outboxq.registry.default_registry unless given).
    """
    validate_queue_name(queue)
    name = queue if name is None else name
    if not isinstance(name, str) or not name or len(name) > 200:
        raise InvalidInput(f"periodic name must be a non-empty string of at most 200 characters, not {name!r}")
    if (cron is None) == (every is None):
        raise InvalidInput(f"periodic {name!r}: give exactly one of cron= and every=")
    if every is not None and (not isinstance(every, timedelta) or every < timedelta(seconds=1)):
        raise InvalidInput(f"periodic {name!r}: every must be a timedelta of at least one second, not {every!r}")
    if cron is not None:
        fields = cron.split() if isinstance(cron, str) else []
        if len(fields) not in (5, 6) or not croniter.is_valid(cron, second_at_beginning=len(fields) == 6):
            raise InvalidInput(f"periodic {name!r}: {cron!r} is not a cron expression of 5 fields "
                               "(minute hour day month weekday), or 6 with a leading seconds field")
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise InvalidInput(f"periodic {name!r}: unknown timezone {timezone!r} (use an IANA name such as "
                           "'Europe/Paris')") from exc
    if missed not in MISSED_POLICIES:
        raise InvalidInput(f"periodic {name!r}: missed must be one of {', '.join(MISSED_POLICIES)}, not {missed!r}")
    try:
        json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"periodic {name!r}: the payload must be JSON ({exc})") from exc
    schedule = Schedule(name=name, queue=queue, cron=cron, every=every, payload=payload, timezone=timezone,
                        missed=missed)
    _check_slots(schedule)
    (registry or default_registry).add_schedule(schedule)
    return schedule


def _check_slots(schedule: Schedule) -> None:
    """Refuse a schedule whose next CHECKED_SLOTS slots from now cannot be computed."""
    slot = datetime.now(UTC)
    try:
        for _ in range(CHECKED_SLOTS):
            slot = schedule.next_after(slot)
    except Exception as exc:  # CroniterBadDateError (no date matches), OverflowError (past 9999), ...
        if schedule.cron is not None:
            what = f"cron {schedule.cron!r}"
            fix = "a cron expression must match dates that exist (not February 30th)"
        else:
            what = f"every={schedule.every!r}"
            fix = "every= must be short enough for its slots to be dates (before 10000)"
        raise InvalidInput(f"periodic {schedule.name!r}: {what} has no next slot from now on "
                           f"({type(exc).__name__}: {exc}); {fix}") from exc


def all_schedules() -> list[Schedule]:
    """Every schedule of the default registry."""
    return default_registry.schedules()


def stored_schedules(conn: Any) -> list[dict[str, Any]]:
    """The schedules the workers wrote, with their last and next slots and the last slot's job status."""
    from psycopg.rows import dict_row

    from outboxq.queue.sql import schedules as periodic_sql

    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(periodic_sql.schedule_list, {"name": None}).fetchall()
