"""Periodic schedules (outboxq.periodic) on a real PostgreSQL: one job per slot however many workers run and
die, missed slots per policy, slot arithmetic for cron and every, the `outboxq periodic` listing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import psycopg
import pytest

from outboxq import cli
from outboxq.errors import InvalidInput
from outboxq.workers import scheduler as scheduler_module
from outboxq.workers.periodic import Schedule, periodic, slot_key
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker
from outboxq.workers.scheduler import slots_to_run
from tests.support import stop_processes, wait_for

ROOT = Path(__file__).resolve().parents[2]
RUNS_DDL = ("CREATE TABLE IF NOT EXISTS test_periodic_runs (key text PRIMARY KEY, job_id bigint, "
            "ran_at timestamptz DEFAULT clock_timestamp())")


def _start_worker(db_url, log_path):
    env = {**os.environ, "DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)}
    log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(
        [sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "worker", "--processes", "1",
         "--handlers", "tests.handlers_periodic", "--poll-interval", "0.2"],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )


_stop = stop_processes


def _slots(db_url, policy):
    """The slots of the schedule with this policy that have a job, and those whose job ran, oldest first."""
    prefix = f"periodic:every-second-{policy}:"
    with psycopg.connect(db_url) as c:
        jobs = [r[0] for r in c.execute("SELECT key FROM outboxq_jobs WHERE key LIKE %s ORDER BY key",
                                        (prefix + "%",))]
        runs = [r[0] for r in c.execute("SELECT key FROM test_periodic_runs WHERE key LIKE %s ORDER BY key",
                                        (prefix + "%",))]
    parse = lambda key: datetime.strptime(key[len(prefix):], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)  # noqa: E731
    return [parse(k) for k in jobs], [parse(k) for k in runs]


def _gaps(slots):
    """The runs of consecutive missing seconds between the first and last slot: [(after, missing count)]."""
    return [(a, int((b - a).total_seconds()) - 1) for a, b in zip(slots, slots[1:], strict=False)
            if (b - a).total_seconds() > 1]


def test_three_workers_one_killed_one_restarted_make_one_run_per_slot(db_url, tmp_path):
    with psycopg.connect(db_url) as c:
        c.execute(RUNS_DDL)
    log = tmp_path / "workers.log"
    workers = [_start_worker(db_url, log) for _ in range(3)]

    def slots_pass(more):
        """Wait until `more` further slots of each schedule have their job (one a second while any worker runs)."""
        goal = len(_slots(db_url, "all")[0]) + more
        wait_for(lambda: len(_slots(db_url, "all")[0]) >= goal, timeout=more + 30)

    try:
        slots_pass(5)
        workers[0].send_signal(signal.SIGKILL)  # dies without a word; its connections just drop
        workers[0].wait()
        slots_pass(4)
        _stop(workers[1])
        slots_pass(2)
        workers[1] = _start_worker(db_url, log)
        slots_pass(7)
    finally:
        _stop(*workers)
    for policy in ("latest", "skip", "all"):
        jobs, runs = _slots(db_url, policy)
        assert len(jobs) >= 15, (policy, jobs)
        assert _gaps(jobs) == [], f"{policy}: slots missing while workers ran: {_gaps(jobs)}"
        # Every slot's job ran exactly once (runs has a primary key on the slot's key), bar the newest
        # ones that were still queued or rescued when the workers stopped.
        assert set(runs) <= set(jobs) and len(runs) >= len(jobs) - 3, (policy, len(runs), len(jobs))
    with psycopg.connect(db_url) as c:
        duplicates = c.execute("SELECT key, count(*) FROM outboxq_jobs GROUP BY key HAVING count(*) > 1").fetchall()
    assert duplicates == []


def test_all_workers_stopped_then_restarted_follow_each_missed_policy(db_url, tmp_path):
    with psycopg.connect(db_url) as c:
        c.execute(RUNS_DDL)
    log = tmp_path / "workers.log"
    first = _start_worker(db_url, log)
    try:
        wait_for(lambda: len(_slots(db_url, "all")[0]) >= 3, timeout=30)
    finally:
        _stop(first)
    stopped_at = datetime.now(UTC)
    time.sleep(10)
    second = _start_worker(db_url, log)
    try:
        wait_for(lambda: len([s for s in _slots(db_url, "all")[0] if s > stopped_at + timedelta(seconds=12)])
                 >= 3, timeout=30)
    finally:
        _stop(second)
    all_slots, _ = _slots(db_url, "all")
    assert _gaps(all_slots) == [], "missed='all' runs every missed slot"
    skip_gaps = _gaps(_slots(db_url, "skip")[0])
    latest_gaps = _gaps(_slots(db_url, "latest")[0])
    # One outage: "skip" leaves one gap of every missed slot; "latest" the same gap but one slot shorter,
    # that slot (the most recent missed one) being run once.
    assert len(skip_gaps) == 1 and skip_gaps[0][1] >= 7, skip_gaps
    assert len(latest_gaps) == 1 and latest_gaps[0] == (skip_gaps[0][0], skip_gaps[0][1] - 1), \
        (latest_gaps, skip_gaps)


def test_a_slots_job_is_enqueued_at_its_time_and_runs_within_a_second(db_url):
    ran: list[tuple[str, float]] = []
    consumer = Consumer(queue="beat", handler=lambda payload, ctx: ran.append((ctx.key, time.time())))
    schedule = Schedule(name="beat", queue="beat", every=timedelta(seconds=1), payload={"x": 1})
    worker = Worker([consumer], url=db_url, schedules=[schedule], poll_interval=5.0, concurrency=2).start()
    try:
        wait_for(lambda: len(ran) >= 3, timeout=15)
    finally:
        worker.stop(timeout=5)
    for key, at in ran[1:]:
        slot = datetime.strptime(key[len("periodic:beat:"):], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        delay = at - slot.timestamp()
        assert 0 <= delay < 1.0, (key, delay)  # the poll interval is 5 s: the new-job notification woke it


def test_outboxq_periodic_lists_schedules_with_last_and_next_slot(db_url, capsys):
    consumer = Consumer(queue="beat", handler=lambda payload: None)
    schedule = Schedule(name="nightly", queue="beat", cron="0 3 * * *", timezone="Europe/Paris")
    every = Schedule(name="beat", queue="beat", every=timedelta(seconds=1))
    worker = Worker([consumer], url=db_url, schedules=[schedule, every], poll_interval=0.2).start()
    try:
        wait_for(lambda: worker.scheduler.enqueued >= 1, timeout=10)
    finally:
        worker.stop(timeout=5)
    assert cli.main(["periodic", "--json"]) == 0
    listed = {s["name"]: s for s in json.loads(capsys.readouterr().out)}
    assert listed["nightly"]["spec"] == "cron:0 3 * * *" and listed["nightly"]["last_slot"] is None
    next_nightly = datetime.fromisoformat(listed["nightly"]["next_slot"])
    assert next_nightly.astimezone(ZoneInfo("Europe/Paris")).hour == 3
    assert listed["beat"]["last_slot"] is not None and listed["beat"]["last_job_id"] is not None


def test_slot_arithmetic_and_missed_policies():
    every = Schedule(name="e", queue="q", every=timedelta(seconds=10))
    at = datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    assert every.next_after(at) == datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)
    assert every.next_after(datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)) == datetime(2026, 1, 1, 0, 0, 20, tzinfo=UTC)
    cron6 = Schedule(name="c", queue="q", cron="*/30 * * * * *")
    assert cron6.slots_between(datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 1, 5, tzinfo=UTC)) == [
        datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in (0, 30)] + [datetime(2026, 1, 1, 0, 1, tzinfo=UTC)]
    # Daylight saving time: 02:30 Paris does not exist on 2026-03-29; the 03:00 slot is 01:00 UTC that day.
    paris = Schedule(name="p", queue="q", cron="0 3 * * *", timezone="Europe/Paris")
    assert paris.next_after(datetime(2026, 3, 28, 12, tzinfo=UTC)) == datetime(2026, 3, 29, 1, tzinfo=UTC)
    assert slot_key("n", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "periodic:n:2026-01-02T03:04:05Z"
    due = [datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in range(6)]
    cut = datetime(2026, 1, 1, 0, 0, 3, tzinfo=UTC)
    assert slots_to_run("all", due, cut) == due
    assert slots_to_run("latest", due, cut) == due[2:]
    assert slots_to_run("skip", due, cut) == due[3:]
    assert len(every.slots_between(at - timedelta(days=30), at)) == 1000  # missed="all" is bounded


@pytest.mark.parametrize("options, message", [
    ({}, "exactly one of cron= and every="),
    ({"cron": "* * * * *", "every": timedelta(seconds=5)}, "exactly one"),
    ({"every": timedelta(milliseconds=500)}, "at least one second"),
    ({"cron": "61 * * * *"}, "not a cron expression"),
    ({"cron": "* * * *"}, "not a cron expression"),
    ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "unknown timezone"),
    ({"cron": "* * * * *", "missed": "some"}, "missed must be"),
    ({"cron": "* * * * *", "payload": {1, 2}}, "must be JSON"),
    # Valid expressions with no slot: computed at declaration, not in every worker's scheduler at run time.
    ({"cron": "0 0 30 2 *"}, r"cron '0 0 30 2 \*' has no next slot from now on \(CroniterBadDateError"),
    ({"cron": "0 0 0 31 4 *"}, r"cron '0 0 0 31 4 \*' has no next slot .* \(not February 30th\)"),
    ({"every": timedelta(days=3650000)}, r"every=datetime.timedelta\(days=3650000\) has no next slot from now on "
                                         r"\(OverflowError.*before 10000"),
])
def test_bad_schedules_are_refused_with_what_to_fix(options, message):
    with pytest.raises(InvalidInput, match=message):
        periodic("q", name="bad", **options)


def test_leap_days_and_long_periods_are_accepted():
    assert periodic("q", name="leap", cron="0 0 29 2 *").cron == "0 0 29 2 *"
    assert periodic("q", name="millennium", every=timedelta(days=365_000)).every == timedelta(days=365_000)


class _FailsAtRunTime(Schedule):
    """A schedule whose due slots cannot be computed (its next one can: it is written at start)."""

    def slots_between(self, first, last, limit=1000):
        raise RuntimeError("no slots today")


def test_a_schedule_whose_slots_cannot_be_computed_is_left_out_and_the_others_fire(db_url, caplog, monkeypatch):
    monkeypatch.setattr(scheduler_module, "SCHEDULE_RETRY_S", 0.5)
    ran: list[str] = []
    consumer = Consumer(queue="beat", handler=lambda payload, ctx: ran.append(ctx.key))
    schedules = [
        Schedule(name="beat", queue="beat", every=timedelta(seconds=1)),
        # Made by hand, so never checked by periodic(): one fails at start, one each time it is due.
        Schedule(name="february-30", queue="beat", cron="0 0 30 2 *"),
        Schedule(name="far", queue="beat", every=timedelta(days=3650000)),
        _FailsAtRunTime(name="flaky", queue="beat", every=timedelta(seconds=1)),
    ]
    worker = Worker([consumer], url=db_url, schedules=schedules, poll_interval=0.2).start()
    try:
        wait_for(lambda: len(ran) >= 3, timeout=10)
        # Left out, then tried again after SCHEDULE_RETRY_S (and left out again).
        wait_for(lambda: sum("periodic flaky" in r.getMessage() for r in caplog.records) >= 2, timeout=5)
    finally:
        worker.stop(timeout=5)
    assert all(key.startswith("periodic:beat:") for key in ran)
    errors = {r.getMessage().split(" (")[0]: r for r in caplog.records if r.levelname == "ERROR"}
    assert set(errors) == {"periodic february-30", "periodic far", "periodic flaky"}, list(errors)
    assert "CroniterBadDateError" in errors["periodic february-30"].getMessage()
    assert "OverflowError" in errors["periodic far"].getMessage()
    assert all(r.exc_info is not None for r in errors.values())
    assert worker.health()["rooms"]["scheduler"] == {"alive": True, "failures": 0, "last_error": None}
    with psycopg.connect(db_url) as c:
        jobs = {r[0] for r in c.execute("SELECT key FROM outboxq_jobs")}
    assert jobs and all(key.startswith("periodic:beat:") for key in jobs)
