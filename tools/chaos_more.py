"""More `python -m tools chaos` scenarios: periodic schedules, flow-control limits, poisoned handlers and Spark drivers
under faults.

Each runs on its own database (on the private embedded server unless --database-url is given), reuses the
default scenario's processes and faults (tools/chaos.py: SIGKILL of a worker, pg_terminate_backend of its
connections, a PostgreSQL restart, a worker frozen past its lease) and adds its own:

- periodic: three schedules (every 1 s missed="all", every 1 s missed="skip", a 6-field cron every 2 s
  missed="latest") on several workers; faults add a short pause (SIGSTOP just past the lease) and an outage
  (every worker SIGKILLed, restarted a few seconds later). Checked: one job per slot, no slot missing between
  the first and the last except, for "skip" and "latest", slots due during an outage (what those policies
  document), every slot's job done with its run recorded exactly once.
- limits: a queue with global_concurrency=3 and one limited to 2 per tenant (limit_by), jobs trickled in
  while the faults hit. A trigger on outboxq_jobs (installed in the scenario's database only) logs every
  change of a job's status or lease, so the check counts from the database's own record how many jobs held a
  valid lease at once (a killed or frozen worker's job holds its slot until its lease expires, and again if a
  heartbeat renews it); the handlers' own start/end rows give how many ran at once (an attempt with no end
  ends with its last valid lease). Neither may exceed the limit; no job lost, no effect written twice.
- poison: ordinary jobs with, one in ten, jobs whose handler returns or raises a hostile value (a NUL
  character, a lone surrogate, NaN and Infinity, values JSON cannot encode, a 3 MB result, a 1 MB error, 10,000
  nested lists, an exception that cannot be printed: tools/chaos_poison_handlers.py), on the same workers,
  under kills, cuts, restarts and zombies. Checked: every ordinary job done with its effect written exactly
  once; every poisoned job dead with its last_error stored (none left running or retrying), and for each
  kind at least one ended by its own outcome (not only by rescues), so the worker wrote what the poison made.
- spark: two `outboxq spark run` drivers of one processor (order_lines: one result row per job) on one queue;
  one is SIGKILLed (its process group: driver and JVM) while it holds an undelivered batch, the other's
  connections are cut meanwhile. Checked: every job done, each job's row delivered exactly once with its exact
  value, per-customer sums exact, every snapshot delivered.
- workflows: diamond workflows (fetch -> left, right -> join, each step on a queue of its own) and sequences of
  jobs (enqueue(sequence=...), each job in its own committed transaction, interleaved across sequences) trickled
  in under kills, cuts, restarts and zombies (tools/chaos_workflow_handlers.py). Checked: every workflow done,
  every step's effect and every sequence job's run written exactly once; each step after the steps before it,
  the join having seen both parents' results (their sum exact); each sequence's runs in enqueue order, none
  starting before the one before it ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql as pgsql

from outboxq import Workflow, enqueue, enqueue_many, get_workflow
from tools.chaos import ROOT, WORKER_APP_NAME, ChaosConfig, Scenario
from tools.chaos_handlers import CHAOS_LEASE_S

# How long the periodic scenario's outage waits for the schedulers to catch up with the faults before it.
OUTAGE_CATCH_UP_S = 15.0
SPARK_APP_NAME = "outboxq-chaos-spark"
SPARK_QUEUE = "chaos-orders"
SPARK_TABLE = "chaos_order_lines"
SPARK_LEASE_S = 5.0


@dataclass
class MoreConfig:
    """Sizes of the added scenarios (the faults and the server come from the default scenario's settings)."""

    workers: int = 3
    duration_s: float = 60.0  # periodic and limits: how long the faults go on
    limit_jobs: int = 1200  # limits: jobs trickled over duration_s
    poison_jobs: int = 2000  # poison: jobs trickled over duration_s, one in POISON_EVERY poisoned
    spark_jobs: int = 600
    spark_batch_size: int = 20
    workflows: int = 60  # workflows: diamonds (4 steps each) trickled over workflow_duration_s
    sequences: int = 4  # workflows: sequences, of sequence_jobs jobs each, trickled alongside
    sequence_jobs: int = 15
    workflow_duration_s: float = 20.0
    fault_interval_s: float = 2.0
    outage_s: float = 5.0
    timeout_s: float = 300.0
    seed: int = 1
    database_url: str | None = None


@dataclass
class ScenarioResult:
    """One row of the chaos table, and the details behind it."""

    scenario: str
    faults: Counter = field(default_factory=Counter)
    jobs: int = 0
    lost: int = 0
    duplicated: int = 0
    not_finished: int = 0
    gaps: int | str = "-"  # periodic: slots missing that their policy does not allow
    limit_exceeded: int | str = "-"  # limits: groups (queue or queue/key) that ever ran above their limit
    order_violations: int | str = "-"  # workflows: steps or sequence jobs that ran out of their order
    elapsed_s: float = 0.0
    details: list[tuple[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "faults": dict(self.faults), "jobs": self.jobs, "lost": self.lost,
                "duplicated": self.duplicated, "not_finished": self.not_finished, "gaps": self.gaps,
                "limit_exceeded": self.limit_exceeded, "order_violations": self.order_violations,
                "elapsed_s": self.elapsed_s,
                "details": {k: v for k, v in self.details}, "problems": self.problems, "ok": self.ok}


def max_at_once(intervals: list[tuple[Any, Any]]) -> int:
    """The most intervals [start, end) open at one instant (an end at the instant of a start frees first)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    at_once = best = 0
    for _, delta in events:
        at_once += delta
        best = max(best, at_once)
    return best


# ---------------------------------------------------------------------------------------------- base


class _WorkerScenario(Scenario):
    """A scenario of tools/chaos.py's kind (own database, least-privilege role, faults) with other handlers."""

    name = ""
    handlers = ""
    fault_kinds: tuple[str, ...] = ()

    def __init__(self, config: MoreConfig, out=sys.stdout):
        super().__init__(ChaosConfig(workers=config.workers, http_fraction=0.0, faults=self.fault_kinds,
                                     fault_interval_s=config.fault_interval_s, timeout_s=config.timeout_s,
                                     seed=config.seed, database_url=config.database_url), out=out)
        self.more = config
        self.result = ScenarioResult(self.name)
        self.result.faults = self.report.faults  # the fault loop counts into the default scenario's report
        self.outages: list[tuple[datetime, datetime]] = []  # periodic: (every worker dead, first one back)
        self.paused_workers: set[int] = set()

    # -- set-up: the default scenario's, plus this scenario's tables; no API, workers started by run()
    def setup(self) -> None:
        workers, self.config.workers = self.config.workers, 0
        super().setup()
        self.config.workers = workers
        with psycopg.connect(self.url, autocommit=True) as conn:
            for statement in self.ddl():
                conn.execute(statement)

    def ddl(self) -> list[str]:
        return []

    def _start_worker(self, index: int) -> subprocess.Popen:
        log = open(self.log_dir / f"worker-{index}-{time.monotonic_ns()}.log", "w")  # noqa: SIM115
        return subprocess.Popen(
            [sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "worker", "--handlers", self.handlers,
             "--processes", "1", "--concurrency", "4", "--batch-size", "20"],
            env={**self._env(), "PGAPPNAME": f"{WORKER_APP_NAME}:{index}"}, cwd=ROOT, stdout=log, stderr=log,
        )

    def start_workers(self) -> None:
        for i in range(self.config.workers):
            self.workers.append(self._start_worker(i))

    def db_now(self) -> datetime:
        with psycopg.connect(self.url) as conn:
            return conn.execute("SELECT clock_timestamp()").fetchone()[0]

    # -- faults: the workers' application names are WORKER_APP_NAME:index, so that the leader can be found
    def _fault_terminate(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE %s",
                         (f"{WORKER_APP_NAME}:%",))

    def _leader(self) -> subprocess.Popen | None:
        """The worker whose maintenance thread holds the advisory lock (it alone rescues expired leases)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE %s LIMIT 1",
                (f"{WORKER_APP_NAME}:%",)).fetchone()
        return self.workers[int(row[0].rsplit(":", 1)[1])] if row else None

    def _fault_pause(self) -> None:
        """Freeze a worker just past its lease (a long GC pause, a stalled VM), then resume it: every other
        time the maintenance leader (nobody rescues its expired leases meanwhile), else a worker holding jobs."""
        by_pid = {w.pid: w for w in self.workers}
        with psycopg.connect(self.url, autocommit=True) as conn:
            holders = [int(r[0].split(":")[1]) for r in conn.execute(
                "SELECT DISTINCT worker_id FROM outboxq_jobs WHERE status = 'running'").fetchall()]
        candidates = [by_pid[pid] for pid in holders if pid in by_pid]
        leader = self._leader() if self.report.faults["pause"] % 2 == 0 else None
        worker = leader or self.rng.choice(candidates or self.workers)
        worker.send_signal(signal.SIGSTOP)
        time.sleep(CHAOS_LEASE_S + 0.3 + self.rng.random() * 1.5)
        worker.send_signal(signal.SIGCONT)

    def _fault_outage(self) -> None:
        """Every worker SIGKILLed at once; restarted after outage_s. Records when the first one is back."""
        for w in self.workers:
            w.kill()
        for w in self.workers:
            w.wait()
        dead_at = self.db_now()
        time.sleep(self.more.outage_s)
        for i in range(len(self.workers)):
            self.workers[i] = self._start_worker(i)
        back_at = self._first_worker_connected()
        self.outages.append((dead_at, back_at))

    def _first_worker_connected(self) -> datetime:
        deadline = time.monotonic() + 60
        with psycopg.connect(self.url, autocommit=True) as conn:
            while time.monotonic() < deadline:
                row = conn.execute("SELECT min(backend_start) FROM pg_stat_activity WHERE application_name LIKE %s",
                                   (f"{WORKER_APP_NAME}:%",)).fetchone()
                if row[0] is not None:
                    return row[0]
                time.sleep(0.05)
        raise RuntimeError("no worker came back within 60 s")

    def fault_thread(self) -> threading.Thread:
        self.report.problems = self.result.problems  # faults that could not be injected are problems
        return threading.Thread(target=self._fault_loop, daemon=True)

    def finish(self, started: float) -> None:
        self.result.elapsed_s = round(time.monotonic() - started, 1)

    def _produce_under_faults(self, duration_s: float) -> float:
        """Set up, start the workers, run the scenario's producer (`_produce`) while faults are injected for
        `duration_s` (at least until the producer ends); when it started (monotonic)."""
        started = time.monotonic()
        self.setup()
        self.start_workers()
        faults = self.fault_thread()
        producer = threading.Thread(target=self._produce)
        faults.start()
        producer.start()
        producer.join()
        self._stop_faults.wait(max(0.0, duration_s - (time.monotonic() - started)))
        self._stop_faults.set()
        faults.join()
        return started


# ------------------------------------------------------------------------------------------ periodic


class PeriodicScenario(_WorkerScenario):
    """Schedules under faults: one job per slot, no gaps but those the missed policy allows, one run each."""

    name = "periodic"
    handlers = "tools.chaos_periodic_handlers"
    fault_kinds = ("kill", "terminate", "pg_restart", "zombie", "pause", "outage")

    def ddl(self) -> list[str]:
        from tools.chaos_periodic_handlers import RUNS_DDL

        return [RUNS_DDL, f'GRANT SELECT, INSERT ON chaos_periodic_runs TO "{self.app_role}"']

    def execute(self) -> ScenarioResult:
        started = time.monotonic()
        self.setup()
        self.start_workers()
        faults = self.fault_thread()
        faults.start()
        self._stop_faults.wait(self.more.duration_s)
        self._stop_faults.set()
        faults.join()
        # Faults over: the schedulers catch up (every schedule has a job for a slot after now), and every slot
        # due until now must then finish while the workers still run.
        settled_at = self.db_now()
        deadline = time.monotonic() + self.config.timeout_s
        # Caught up first, then unfinished: a scheduler's catch-up commits its missed slots' jobs (run_at in the
        # past) with its first slot after settled_at, so read in the other order a catch-up committed between
        # the two reads passed both (nothing unfinished yet, caught up now), and its jobs were counted unfinished
        # by the check after the workers stopped (a CI run failed so: "not_finished: 5").
        while time.monotonic() < deadline and (not self._caught_up(settled_at) or self._unfinished(settled_at)):
            time.sleep(0.5)
        self._stop_processes()
        self.finish(started)
        self._check(settled_at)
        return self.result

    def _fault_outage(self) -> None:
        """Every worker killed, as in every scenario, but only once the schedulers have caught up with the faults
        before it: a slot missing afterwards was due while no worker ran, which is what the `missed` policies
        speak of. (Killed first, the slots of the seconds before the outage, held back by a frozen worker or a
        restarted database, went to the restarted schedulers' "skip": a gap the check cannot tell from one it
        must report; it failed a CI run so.) Schedulers that never catch up are a problem reported."""
        deadline = time.monotonic() + OUTAGE_CATCH_UP_S
        while not self._caught_up(self.db_now() - timedelta(seconds=2.5)):  # (the cron schedule's slots: 2 s)
            if time.monotonic() > deadline:
                raise RuntimeError(f"the schedulers did not catch up within {OUTAGE_CATCH_UP_S} s of the faults")
            time.sleep(0.1)
        super()._fault_outage()

    def _caught_up(self, after: datetime) -> bool:
        from tools.chaos_periodic_handlers import SCHEDULES

        with psycopg.connect(self.url) as conn:
            return all(conn.execute("SELECT EXISTS (SELECT 1 FROM outboxq_jobs WHERE key LIKE %s AND run_at > %s)",
                                    (f"periodic:{s.name}:%", after)).fetchone()[0] for s in SCHEDULES)

    def _unfinished(self, before: datetime) -> int:
        with psycopg.connect(self.url) as conn:
            return conn.execute("SELECT count(*) FROM outboxq_jobs WHERE run_at <= %s AND status <> 'done'",
                                (before,)).fetchone()[0]

    def _check(self, settled_at: datetime) -> None:
        from outboxq.workers.scheduler import MISSED_GRACE_S
        from tools.chaos_periodic_handlers import SCHEDULES

        r = self.result
        with psycopg.connect(self.url) as conn:
            jobs = conn.execute("SELECT key, status, run_at FROM outboxq_jobs").fetchall()
            runs = Counter(k for (k,) in conn.execute("SELECT key FROM chaos_periodic_runs").fetchall())
        per_key = Counter(k for k, _, _ in jobs)
        r.jobs = len(jobs)
        r.duplicated = sum(n - 1 for n in per_key.values() if n > 1) + sum(n - 1 for n in runs.values() if n > 1)
        r.not_finished = sum(1 for _, status, run_at in jobs if status != "done" and run_at <= settled_at)
        r.lost = sum(1 for k, status, _ in jobs if status == "done" and runs[k] == 0)  # done, its run missing
        r.lost += sum(1 for k in runs if k not in per_key)  # a run of a job that does not exist
        r.gaps = 0
        for s in SCHEDULES:
            prefix = f"periodic:{s.name}:"
            slots = sorted(datetime.strptime(k[len(prefix):], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
                           for k in per_key if k.startswith(prefix))
            if len(slots) < 2:
                r.problems.append(f"schedule {s.name}: only {len(slots)} slots")
                continue
            period = s.next_after(slots[0]) - slots[0]
            expected = s.slots_between(slots[0], slots[-1], limit=10**6)
            missing = sorted(set(expected) - set(slots))
            off_schedule = sorted(set(slots) - set(expected))
            # A slot may be missing only where the policy says so: due while no worker ran, older than the
            # restarted schedulers' grace (their start is at or after the first worker connection back).
            allowed = [m for m in missing if s.missed != "all" and any(
                dead - period < m < back - timedelta(seconds=MISSED_GRACE_S - 1.0) for dead, back in self.outages)]
            bad = [m for m in missing if m not in allowed]
            r.gaps += len(bad) + len(off_schedule)
            r.details.append((f"{s.name} ({s.spec}, missed={s.missed})",
                              f"{len(slots)} slots {slots[0]:%H:%M:%S}–{slots[-1]:%H:%M:%S}, "
                              f"{len(allowed)} skipped during outages as documented, {len(bad)} missing otherwise"))
            if bad:
                r.problems.append(f"{s.name}: slots missing outside outages: "
                                  + ", ".join(f"{m:%H:%M:%S}" for m in bad[:10]))
            if off_schedule:
                r.problems.append(f"{s.name}: jobs for slots not on the schedule: {off_schedule[:5]}")
        r.details.append(("outages (every worker dead → first back)",
                          ", ".join(f"{d:%H:%M:%S.%f}"[:-3] + f" → {b:%H:%M:%S.%f}"[:-3] for d, b in self.outages)
                          or "none"))
        for name in ("duplicated", "lost", "not_finished"):
            if getattr(r, name):
                r.problems.append(f"{name}: {getattr(r, name)}")


# -------------------------------------------------------------------------------------------- limits

LEASE_LOG_DDL = [
    """CREATE TABLE chaos_lease_log (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, job_id bigint NOT NULL, queue text NOT NULL,
        limit_key text, attempt int, status text NOT NULL, lease_token uuid, lease_expires_at timestamptz,
        at timestamptz NOT NULL DEFAULT clock_timestamp())""",
    """CREATE FUNCTION chaos_log_lease() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO chaos_lease_log (job_id, queue, limit_key, attempt, status, lease_token, lease_expires_at)
        VALUES (NEW.id, NEW.queue, NEW.limit_key, NEW.attempts, NEW.status, NEW.lease_token, NEW.lease_expires_at);
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER chaos_log_lease AFTER UPDATE ON outboxq_jobs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.lease_token IS DISTINCT FROM NEW.lease_token
          OR OLD.lease_expires_at IS DISTINCT FROM NEW.lease_expires_at)
    EXECUTE FUNCTION chaos_log_lease()""",
]


def renewed_after_expiry(events: list[tuple]) -> int:
    """How many times a lease was renewed (same token, still running) after it had expired: a frozen worker's
    heartbeat reviving a lease whose slot the claims already counted as free."""
    last: dict[int, tuple] = {}
    revived = 0
    for job_id, _, status, token, expires, at in events:
        before = last.get(job_id)
        if (before is not None and status == "running" and before[0] == "running" and before[1] == token
                and token is not None and before[2] is not None and at > before[2]):
            revived += 1
        last[job_id] = (status, token, expires)
    return revived


def lease_segments(events: list[tuple]) -> dict[tuple[int, int], list[tuple[datetime, datetime]]]:
    """From the lease log (id order): per (job_id, attempt), the spans during which it held a valid lease.

    A running row's lease is valid from the change that set it until it expires or the next change of that
    job (renewal, completion, rescue), whichever comes first: exactly what the claims count."""
    by_job: dict[int, list[tuple]] = defaultdict(list)
    for e in events:
        by_job[e[0]].append(e)
    spans: dict[tuple[int, int], list[tuple[datetime, datetime]]] = defaultdict(list)
    for job_events in by_job.values():
        for i, (job_id, attempt, status, token, expires, at) in enumerate(job_events):
            if status != "running" or token is None or expires is None:
                continue
            nxt = job_events[i + 1][5] if i + 1 < len(job_events) else None
            end = expires if nxt is None else min(expires, nxt)
            if end > at:
                spans[(job_id, attempt)].append((at, end))
    return spans


class LimitsScenario(_WorkerScenario):
    """global_concurrency and per-key limits under faults: never more than the limit at once."""

    name = "limits"
    handlers = "tools.chaos_limits_handlers"
    fault_kinds = ("kill", "terminate", "pg_restart", "zombie", "pause")
    _waiting_sessions: list[tuple] = []  # (read as the wait for the last jobs ends)

    def ddl(self) -> list[str]:
        from tools.chaos_limits_handlers import RUNS_DDL

        return [RUNS_DDL, *LEASE_LOG_DDL,
                f'GRANT SELECT, INSERT, UPDATE ON chaos_limit_runs TO "{self.app_role}"',
                f'GRANT INSERT ON chaos_lease_log TO "{self.app_role}"']

    def _produce(self) -> None:
        from tools.chaos_limits_handlers import GLOBAL_QUEUE, KEY_QUEUE

        total, made = self.more.limit_jobs, 0
        step_s = 0.2
        per_step = max(1, int(total / max(1.0, self.more.duration_s * 0.75 / step_s)))
        conn: psycopg.Connection | None = None
        while made < total:
            size = min(per_step, total - made)
            rows = []
            for _ in range(size):
                tag = f"{self.run}-{uuid.uuid4().hex[:12]}"
                work_ms = 1500 if self.rng.random() < 0.05 else self.rng.randint(10, 120)
                if self.rng.random() < 0.5:
                    rows.append((GLOBAL_QUEUE, {"tag": tag, "work_ms": work_ms}, None))
                else:
                    tenant = f"t{self.rng.randrange(4)}"
                    rows.append((KEY_QUEUE, {"tag": tag, "work_ms": work_ms, "tenant": tenant}, tenant))
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.app_url)
                for queue in (GLOBAL_QUEUE, KEY_QUEUE):
                    batch = [(p, k) for q, p, k in rows if q == queue]
                    if batch:
                        options = {"limit_keys": [k for _, k in batch]} if queue == KEY_QUEUE else {}
                        enqueue_many(conn, queue, [p for p, _ in batch], **options)
                conn.commit()
                with self._lock:
                    self.committed.update({p["tag"]: q for q, p, _ in rows})
                made += size
            except psycopg.OperationalError:
                with self._lock:  # fate unknown when the commit itself was cut: never counted as lost
                    self.maybe_committed.update(p["tag"] for _, p, _ in rows)
                if conn is not None:
                    conn.close()
                conn = None
            time.sleep(step_s)
        if conn is not None:
            conn.close()

    def execute(self) -> ScenarioResult:
        started = self._produce_under_faults(self.more.duration_s)
        deadline = time.monotonic() + self.config.timeout_s
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.url) as conn:
                    if not conn.execute("SELECT count(*) FROM outboxq_jobs WHERE status <> 'done'").fetchone()[0]:
                        break
            except psycopg.OperationalError:
                pass
            time.sleep(0.5)
        self._waiting_sessions = self._sessions_waiting()
        self._stop_processes()
        self.finish(started)
        self._check()
        return self.result

    def _sessions_waiting(self) -> list[tuple]:
        """The workers' sessions waiting for a lock or idle in a transaction (what holds unfinished jobs back)."""
        try:
            with psycopg.connect(self.url) as conn:
                return conn.execute(
                    "SELECT state, wait_event_type || ':' || wait_event, left(query, 60), "
                    "clock_timestamp() - xact_start FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND (wait_event_type = 'Lock' OR state = 'idle in transaction')"
                ).fetchall()
        except psycopg.OperationalError:
            return []

    def _check(self) -> None:
        from tools.chaos_limits_handlers import GLOBAL_LIMIT, GLOBAL_QUEUE, KEY_LIMIT, KEY_QUEUE

        r = self.result
        with psycopg.connect(self.url) as conn:
            jobs = conn.execute("SELECT id, payload->>'tag', status, queue, limit_key FROM outboxq_jobs").fetchall()
            effects = Counter(t for (t,) in conn.execute("SELECT tag FROM chaos_effects").fetchall())
            log = conn.execute("SELECT job_id, attempt, status, lease_token, lease_expires_at, at "
                               "FROM chaos_lease_log ORDER BY id").fetchall()
            runs = conn.execute("SELECT job_id, attempt, started_at, finished_at FROM chaos_limit_runs").fetchall()
            # What an unfinished job was doing, and what the sessions were waiting for: a failure says why.
            stuck = conn.execute(
                "SELECT id, queue, limit_key, status, attempts, run_at - clock_timestamp(), "
                "lease_expires_at - clock_timestamp() FROM outboxq_jobs WHERE status <> 'done' ORDER BY id LIMIT 5"
            ).fetchall()
        if stuck:
            r.details.append(("unfinished (id, queue, key, status, attempts, due in, lease left)", repr(stuck)))
            r.details.append(("sessions waiting on a lock or idle in a transaction, as the wait ended",
                              repr(self._waiting_sessions) if self._waiting_sessions else "none"))
        group_of = {job_id: (queue, key if queue == KEY_QUEUE else None) for job_id, _, _, queue, key in jobs}
        tags = {tag for _, tag, _, _, _ in jobs}
        r.jobs = len(self.committed)
        r.lost = sum(1 for tag in self.committed if tag not in tags)
        r.duplicated = sum(n - 1 for n in effects.values() if n > 1)
        r.not_finished = sum(1 for _, _, status, _, _ in jobs if status != "done")
        missing = sum(1 for _, tag, status, _, _ in jobs if status == "done" and not effects[tag])
        unknown = sum(1 for tag in tags if tag not in self.committed and tag not in self.maybe_committed)
        if missing:
            r.problems.append(f"{missing} jobs done without their effect")
        if unknown:
            r.problems.append(f"{unknown} jobs exist that no producer committed")

        spans = lease_segments(log)
        leases: dict[tuple, list] = defaultdict(list)
        for (job_id, _), job_spans in spans.items():
            leases[group_of[job_id]].extend(job_spans)
        executions: dict[tuple, list] = defaultdict(list)
        open_ended = 0
        for job_id, attempt, started_at, finished_at in runs:
            end = finished_at
            if end is None:  # killed, frozen and fenced, or its end could not be written: its last valid lease
                open_ended += 1
                end = max((e for _, e in spans.get((job_id, attempt), [])), default=started_at)
            executions[group_of[job_id]].append((started_at, max(end, started_at)))
        r.limit_exceeded = 0
        for label, limit, groups in (
            (GLOBAL_QUEUE, GLOBAL_LIMIT, [(GLOBAL_QUEUE, None)]),
            (f"{KEY_QUEUE} per tenant", KEY_LIMIT, sorted(g for g in leases if g[0] == KEY_QUEUE)),
        ):
            by_lease = {g: max_at_once(leases[g]) for g in groups}
            by_run = {g: max_at_once(executions[g]) for g in groups}
            over = sorted({g for g in groups if by_lease[g] > limit or by_run[g] > limit})
            r.limit_exceeded += len(over)
            r.details.append((f"{label} (limit {limit}): most at once",
                              f"valid leases {max(by_lease.values(), default=0)}, handlers running "
                              f"{max(by_run.values(), default=0)}"
                              + (f" (per tenant: {', '.join(f'{g[1]} {by_lease[g]}/{by_run[g]}' for g in groups)})"
                                 if len(groups) > 1 else "")))
            for g in over:
                r.problems.append(f"limit exceeded on {g[0]}{'/' + g[1] if g[1] else ''}: {by_lease[g]} valid "
                                  f"leases, {by_run[g]} handlers at once (limit {limit})"
                                  + self._explain_excess(leases[g], limit))
            if max(by_lease.values(), default=0) < limit:
                r.problems.append(f"{label}: the limit {limit} was never reached (the check proves nothing)")
        r.details.append(("attempts recorded (without an end: killed, frozen or cut)", f"{len(runs)} ({open_ended})"))
        r.details.append(("fenced (zombie) writes refused", self.report.zombie_writes_refused))
        r.details.append(("leases renewed after they had expired", renewed_after_expiry(log)))
        for name in ("lost", "duplicated", "not_finished"):
            if getattr(r, name):
                r.problems.append(f"{name}: {getattr(r, name)}")

    @staticmethod
    def _explain_excess(spans: list[tuple], limit: int) -> str:
        """When the limit was first exceeded."""
        events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
        at_once = 0
        for at, delta in events:
            at_once += delta
            if at_once > limit:
                return f"; first at {at:%H:%M:%S.%f}"
        return ""


# -------------------------------------------------------------------------------------------- poison

POISON_EVERY = 10  # one job in ten is poisoned
RESCUE_ERROR_PREFIX = "lease expired"  # the last_error rescue writes (workers/maintenance/rescue.py)


class PoisonScenario(_WorkerScenario):
    """Handlers that return and raise hostile values among ordinary jobs, under faults: the ordinary jobs run
    exactly once, the poisoned ones end dead with their error stored, and no worker is wedged by them."""

    name = "poison"
    handlers = "tools.chaos_poison_handlers"
    fault_kinds = ("kill", "terminate", "pg_restart", "zombie")

    def ddl(self) -> list[str]:
        # (imported here, not at the top: the poison consumers register only where this scenario runs)
        from tools.chaos_poison_handlers import RUNS_DDL

        return [RUNS_DDL, f'GRANT INSERT ON chaos_poison_runs TO "{self.app_role}"']

    def _produce(self) -> None:
        """Trickle poison_jobs over most of the duration; every POISON_EVERY-th is poisoned, its kind taken in
        turn (so that each kind has its share however small the run)."""
        from tools.chaos_poison_handlers import OK_QUEUE, POISON_QUEUE, POISONS

        kinds = list(POISONS)
        total, made = self.more.poison_jobs, 0
        step_s = 0.2
        per_step = max(1, int(total / max(1.0, self.more.duration_s * 0.75 / step_s)))
        conn: psycopg.Connection | None = None
        while made < total:
            rows = []
            for i in range(made, min(made + per_step, total)):
                tag = f"{self.run}-{uuid.uuid4().hex[:12]}"
                if i % POISON_EVERY == POISON_EVERY - 1:
                    rows.append((POISON_QUEUE, {"tag": tag, "kind": kinds[i // POISON_EVERY % len(kinds)]}))
                else:  # some work longer, so that killed and frozen workers hold ordinary jobs mid-handler
                    rows.append((OK_QUEUE, {"tag": tag, "work_ms": 200 if self.rng.random() < 0.05 else 2}))
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.app_url)
                for queue in (OK_QUEUE, POISON_QUEUE):
                    payloads = [p for q, p in rows if q == queue]
                    if payloads:
                        enqueue_many(conn, queue, payloads)
                conn.commit()
                with self._lock:
                    self.committed.update({p["tag"]: q for q, p in rows})
                made += len(rows)
            except psycopg.OperationalError:
                with self._lock:  # fate unknown when the commit itself was cut: never counted as lost
                    self.maybe_committed.update(p["tag"] for _, p in rows)
                if conn is not None:
                    conn.close()
                conn = None
            time.sleep(step_s)
        if conn is not None:
            conn.close()

    def execute(self) -> ScenarioResult:
        started = self._produce_under_faults(self.more.duration_s)
        deadline = time.monotonic() + self.config.timeout_s
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.url) as conn:
                    if not conn.execute("SELECT count(*) FROM outboxq_jobs "
                                        "WHERE status NOT IN ('done', 'dead', 'cancelled')").fetchone()[0]:
                        break
            except psycopg.OperationalError:
                pass
            time.sleep(0.5)
        # A worker the faults did not kill has no reason to exit: one that did was brought down by a poison.
        exited = [(i, w.returncode) for i, w in enumerate(self.workers) if w.poll() is not None]
        self._stop_processes()
        self.finish(started)
        self._check(exited)
        return self.result

    def _worker_logs(self) -> tuple[int, str, int]:
        """From the workers' logs: the completer's failed writes (how many, and the last one's message, cut)
        and the exceptions that escaped a thread. A worker wedged by a poison shows here."""
        write_errors, last, escaped = 0, "", 0
        for path in sorted(self.log_dir.glob("worker-*.log")):
            for line in path.read_text(errors="replace").splitlines():
                if "completer: database error" in line:
                    write_errors += 1
                    last = line[:200]
                elif line.startswith("Exception in thread"):
                    escaped += 1
        return write_errors, last, escaped

    def _check(self, exited: list[tuple[int, int | None]]) -> None:
        from tools.chaos_poison_handlers import OK_QUEUE, POISON_MAX_ATTEMPTS, POISON_QUEUE, POISONS

        r = self.result
        with psycopg.connect(self.url) as conn:
            # The error text is read cut (a poisoned one may be megabytes before the bounds apply).
            jobs = conn.execute(
                "SELECT id, payload->>'tag', payload->>'kind', queue, status, attempts, left(last_error, 80), "
                "coalesce(octet_length(last_error), 0), result IS NOT NULL FROM outboxq_jobs").fetchall()
            effects = Counter(t for (t,) in conn.execute("SELECT tag FROM chaos_effects").fetchall())
            runs = Counter(conn.execute("SELECT job_id, attempt FROM chaos_poison_runs").fetchall())
        tags = {job[1] for job in jobs}
        ordinary = [job for job in jobs if job[3] == OK_QUEUE]
        poisoned = [job for job in jobs if job[3] == POISON_QUEUE]
        r.jobs = len(self.committed)
        r.lost = sum(1 for tag in self.committed if tag not in tags)
        unknown = sum(1 for tag in tags if tag not in self.committed and tag not in self.maybe_committed)
        if unknown:
            r.problems.append(f"{unknown} jobs exist that no producer committed")

        # Ordinary jobs: done, their effect written exactly once (only their handler writes effects).
        r.duplicated = sum(n - 1 for n in effects.values() if n > 1)
        not_done = [job for job in ordinary if job[4] != "done"]
        missing = sum(1 for job in ordinary if job[4] == "done" and not effects[job[1]])
        if missing:
            r.problems.append(f"{missing} ordinary jobs done without their effect")

        # Poisoned jobs: dead with an error stored. Their runs are counted but not judged as duplicates: each
        # attempt (rescues use attempts too) runs at most once, so at most POISON_MAX_ATTEMPTS runs a job.
        ended = {job[0] for job in poisoned if job[4] == "dead" and job[7] > 0}
        unresolved = [job for job in poisoned if job[0] not in ended]
        r.not_finished = len(not_done) + len(unresolved)
        runs_per_job = Counter(job_id for job_id, _ in runs.elements())
        r.details += [
            ("ordinary jobs: done / with their result stored", f"{len(ordinary) - len(not_done)} / "
                                                               f"{sum(1 for job in ordinary if job[8])}"),
            ("poisoned jobs", len(poisoned)),
            ("poisoned jobs ended dead with last_error stored", len(ended)),
            ("poisoned runs: total, most for one job (max_attempts), attempts run twice, jobs never run",
             f"{sum(runs.values())}, {max(runs_per_job.values(), default=0)} ({POISON_MAX_ATTEMPTS}), "
             f"{sum(n - 1 for n in runs.values() if n > 1)}, "
             f"{sum(1 for job in poisoned if not runs_per_job[job[0]])}"),
            ("longest last_error stored (bytes)", max((job[7] for job in jobs), default=0)),
        ]
        for kind in POISONS:
            of_kind = [job for job in poisoned if job[2] == kind]
            own = [job for job in of_kind if job[0] in ended and not job[6].startswith(RESCUE_ERROR_PREFIX)]
            r.details.append((f"  {kind}", f"{len(of_kind)} jobs, {len(own)} dead by their own outcome"
                              + (f" (last_error {own[0][6][:48]!r})" if own else "")))
            if not of_kind:
                r.problems.append(f"poison {kind}: no job enqueued (more --poison-jobs)")
            elif not own:  # only rescues ended them: the worker never wrote what this poison made
                r.problems.append(f"poison {kind}: no job ended by its own outcome")
        if unresolved:
            r.details.append(("unresolved (id, queue, kind, status, attempts, last_error)",
                              repr([(job[0], job[3], job[2], job[4], job[5], job[6]) for job in unresolved[:5]])))
        if not_done:
            r.details.append(("ordinary jobs not done (id, status, attempts, last_error)",
                              repr([(job[0], job[4], job[5], job[6]) for job in not_done[:5]])))
        write_errors, last, escaped = self._worker_logs()
        r.details.append(("completer write errors logged (last)", f"{write_errors} ({last})" if last else 0))
        r.details.append(("exceptions that escaped a worker thread", escaped))
        r.details.append(("fenced (zombie) writes refused", self.report.zombie_writes_refused))
        for index, code in exited:
            r.problems.append(f"worker {index} exited by itself (exit code {code})")
        for name in ("lost", "duplicated", "not_finished"):
            if getattr(r, name):
                r.problems.append(f"{name}: {getattr(r, name)}")


# --------------------------------------------------------------------------------------------- spark


class SparkScenario(_WorkerScenario):
    """Two `outboxq spark run` drivers of one processor, one SIGKILLed mid-batch: each result once, sums exact."""

    name = "spark"
    fault_kinds = ("terminate",)

    def __init__(self, config: MoreConfig, out=sys.stdout):
        super().__init__(config, out=out)
        self.drivers: list[subprocess.Popen] = []

    def ddl(self) -> list[str]:
        return []

    def _driver_env(self) -> dict[str, str]:
        return {**os.environ, "DATABASE_URL": self.app_url, "PYTHONPATH": str(ROOT), "PGAPPNAME": SPARK_APP_NAME,
                "OUTBOXQ_SPARK_MASTER": "local[1]", "OUTBOXQ_SPARK_SHUFFLE_PARTITIONS": "1",
                "OUTBOXQ_POLL_INTERVAL": "0.1", "OUTBOXQ_SPARK_LEASE_S": str(SPARK_LEASE_S)}

    def _start_driver(self, index: int) -> subprocess.Popen:
        log = open(self.log_dir / f"driver-{index}.log", "w")  # noqa: SIM115
        # Its own process group: the kill takes the driver's JVM with it, as a lost machine would.
        return subprocess.Popen(
            [sys.executable, "-m", "outboxq.cli", "spark", "run", "--queue", SPARK_QUEUE,
             "--processor", "outboxq.spark_jobs.examples:order_lines", "--output-table", SPARK_TABLE,
             "--batch-size", str(self.more.spark_batch_size), "--driver-id", f"chaos-driver-{index}", "--json"],
            env=self._driver_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True,
            start_new_session=True)

    def _kill_a_driver_mid_batch(self) -> tuple[str, list[tuple]] | None:
        """SIGKILL a driver that holds an undelivered batch after having delivered one: (its id, the batches it
        held), or None while none does. The driver is frozen (SIGSTOP) while its batches are read, so it cannot
        deliver the one it held between the look and the kill."""
        held = self._query(
            "SELECT s.driver_id FROM outboxq_spark_snapshots s WHERE s.state <> 'delivered' AND EXISTS ("
            "SELECT 1 FROM outboxq_spark_snapshots d WHERE d.driver_id = s.driver_id AND d.state = 'delivered')"
            " LIMIT 1")
        if not held:
            return None
        driver_id = held[0][0]
        driver = self.drivers[int(driver_id.rsplit("-", 1)[1])]
        os.killpg(driver.pid, signal.SIGSTOP)
        holding = self._query("SELECT id, jsonb_array_length(job_ids) FROM outboxq_spark_snapshots "
                              "WHERE driver_id = %s AND state <> 'delivered'", driver_id)
        if not holding:  # it delivered in between: let it go on, and look again
            os.killpg(driver.pid, signal.SIGCONT)
            return None
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
        self.victim = driver
        self.report.faults["kill"] += 1
        return driver_id, holding

    def _fault_terminate(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                         (SPARK_APP_NAME,))

    def _query(self, statement: Any, *params: Any) -> list[tuple]:
        with psycopg.connect(self.url) as conn:
            return conn.execute(statement, params).fetchall()

    def _wait(self, predicate, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if any(d.poll() is not None for d in self.drivers if d is not self.victim):
                raise RuntimeError(f"a driver exited while waiting for {what}")
            time.sleep(0.05)
        raise RuntimeError(f"{what}: not within {timeout} s")

    def execute(self) -> ScenarioResult:
        started = time.monotonic()
        self.victim: subprocess.Popen | None = None
        self.setup()
        payloads = [{"customer": f"c{i % 7}", "amount": round(1 + (i * 37 % 1000) / 100, 2), "quantity": 1 + i % 3}
                    for i in range(self.more.spark_jobs)]
        self.drivers = [self._start_driver(i) for i in range(2)]
        faults = self.fault_thread()
        try:
            # Both sessions up before there is work, so that both take batches.
            self._wait(lambda: self._query("SELECT count(*) FROM outboxq_spark_drivers")[0][0] == 2, 180,
                       "both drivers registered")
            with psycopg.connect(self.app_url) as conn:
                jobs = enqueue_many(conn, SPARK_QUEUE, payloads)
                conn.commit()
            expected = {job.id: p for job, p in zip(jobs, payloads, strict=True)}
            self.result.jobs = len(expected)
            faults.start()
            victim_driver_id, killed_holding = self._wait(self._kill_a_driver_mid_batch, 120, "a driver mid-batch")
            self._wait(lambda: self._query("SELECT count(*) FROM outboxq_jobs WHERE status NOT IN "
                                           "('done', 'dead', 'cancelled')")[0][0] == 0,
                       self.config.timeout_s, "every job finished")
        finally:
            self._stop_faults.set()
            if faults.is_alive():
                faults.join()
            for d in self.drivers:
                if d.poll() is None:
                    d.send_signal(signal.SIGTERM)
            outputs = []
            for d in self.drivers:
                try:
                    outputs.append(d.communicate(timeout=120)[0])
                except subprocess.TimeoutExpired:
                    os.killpg(d.pid, signal.SIGKILL)
                    outputs.append(d.communicate()[0])
        self.finish(started)
        self._check(expected, victim_driver_id, killed_holding, outputs)
        return self.result

    def _check(self, expected: dict[int, dict], victim_driver_id: str, killed_holding: list[tuple],
               outputs: list[str]) -> None:
        r = self.result
        rows = self._query(pgsql.SQL("SELECT job_id, customer, line_total FROM {}").format(
            pgsql.Identifier("outboxq_results", SPARK_TABLE)))
        per_job = Counter(job_id for job_id, _, _ in rows)
        r.lost = sum(1 for job_id in expected if per_job[job_id] == 0)
        r.duplicated = sum(n - 1 for n in per_job.values() if n > 1)
        strangers = [job_id for job_id in per_job if job_id not in expected]
        wrong = [job_id for job_id, customer, total in rows if job_id in expected and (
            customer != expected[job_id]["customer"] or total != _line_total(expected[job_id]))]
        statuses = dict(self._query("SELECT status, count(*) FROM outboxq_jobs GROUP BY 1"))
        r.not_finished = sum(n for s, n in statuses.items() if s != "done")
        sums: dict[str, Decimal] = defaultdict(Decimal)
        want: dict[str, Decimal] = defaultdict(Decimal)
        for _, customer, total in rows:
            sums[customer] += Decimal(str(total))
        for p in expected.values():
            want[p["customer"]] += Decimal(str(_line_total(p)))
        snapshots = self._query("SELECT driver_id, state, epoch, jsonb_array_length(job_ids) FROM outboxq_spark_snapshots")
        undelivered = [s for s in snapshots if s[1] != "delivered"]
        survivor = next(d for d in self.drivers if d is not self.victim)
        result = {}
        try:
            result = json.loads(outputs[self.drivers.index(survivor)])
        except (ValueError, IndexError):
            r.problems.append(f"the surviving driver printed no result (exit {survivor.returncode})")
        adopted = sum(1 for s in snapshots if s[2] > 1)
        r.details += [
            ("killed driver", f"{victim_driver_id} (SIGKILL of its process group, holding "
                              f"{sum(n for _, n in killed_holding)} jobs in {len(killed_holding)} undelivered batch(es))"),
            ("batches delivered per driver", ", ".join(f"{d} {n}" for d, n in sorted(Counter(
                s[0] for s in snapshots if s[1] == "delivered").items()))),
            ("snapshots adopted (epoch > 1) / survivor's recovered", f"{adopted} / {result.get('recovered')}"),
            ("result rows / jobs", f"{len(rows)} / {len(expected)}"),
            ("per-customer sums exact", dict(sums) == dict(want)),
        ]
        if strangers:
            r.problems.append(f"{len(strangers)} result rows of unknown jobs")
        if wrong:
            r.problems.append(f"{len(wrong)} result rows with a wrong value")
        if dict(sums) != dict(want):
            r.problems.append(f"per-customer sums differ: {dict(sums)} != {dict(want)}")
        if undelivered:
            r.problems.append(f"{len(undelivered)} snapshots not delivered")
        if not killed_holding:
            r.problems.append("the victim held no undelivered batch when killed (the kill proved nothing)")
        if survivor.returncode != 0:
            r.problems.append(f"the surviving driver exited {survivor.returncode}")
        for name in ("lost", "duplicated", "not_finished"):
            if getattr(r, name):
                r.problems.append(f"{name}: {getattr(r, name)}")


def _line_total(payload: dict) -> float:
    """What order_lines computes for one job (amount × quantity, in double precision, as Spark does)."""
    return float(payload["amount"]) * int(payload["quantity"])


# ----------------------------------------------------------------------------------------- workflows


class WorkflowsScenario(_WorkerScenario):
    """Diamond workflows and sequences under faults: every step and sequence job once, each in its order."""

    name = "workflows"
    handlers = "tools.chaos_workflow_handlers"
    fault_kinds = ("kill", "terminate", "pg_restart", "zombie")

    def __init__(self, config: MoreConfig, out=sys.stdout):
        super().__init__(config, out=out)
        self.workflow_ids: dict[str, int] = {}  # name -> id, of each committed workflow
        self.workflow_bases: dict[str, int] = {}  # name -> the value its fetch step starts from
        self.sequence_tags: dict[str, tuple[str, int]] = {}  # tag -> (sequence, n), of each committed job
        self.cut_commits: Counter = Counter()  # "landed" / "not landed": enqueues whose commit was cut
        self.order_examples: list[str] = []

    def ddl(self) -> list[str]:
        # (imported here, not at the top: the workflow consumers register only where this scenario runs)
        from tools.chaos_workflow_handlers import EFFECTS_DDL, SEQ_RUNS_DDL

        return [EFFECTS_DDL, SEQ_RUNS_DDL, f'GRANT INSERT ON chaos_wf_effects, chaos_seq_runs TO "{self.app_role}"']

    # -- load: each workflow and each sequence job in a transaction of its own, trickled over the fault period
    def _items(self) -> list[tuple]:
        """What the producer enqueues, in order: ("seq", sequence, n) round robin across the sequences (n by n),
        and ("wf", index) spread evenly among them."""
        m = self.more
        jobs = [(n * m.sequences + i, ("seq", f"seq-{i}", n)) for n in range(m.sequence_jobs) for i in range(m.sequences)]
        workflows = [(j * max(1, len(jobs)) / max(1, m.workflows), ("wf", j)) for j in range(m.workflows)]
        return [item for _, item in sorted(jobs + workflows, key=lambda e: e[0])]

    def _name_of(self, item: tuple) -> str:
        return f"chaos-wf-{self.run}-{item[1]}" if item[0] == "wf" else f"{self.run}-{item[1]}-{item[2]}"

    def _write(self, conn: psycopg.Connection, item: tuple) -> int:
        """Enqueue one item in its own transaction and commit it; its workflow's or job's id."""
        from tools.chaos_workflow_handlers import SEQ_QUEUE, STEP_QUEUES

        work_ms = 200 if self.rng.random() < 0.05 else self.rng.randint(20, 60)  # some hold a job longer
        if item[0] == "wf":
            wf = Workflow(self._name_of(item))
            fetch = wf.step("fetch", queue=STEP_QUEUES["fetch"], payload={"base": item[1] + 1, "work_ms": work_ms})
            left = wf.step("left", queue=STEP_QUEUES["left"], payload={"work_ms": work_ms}, after=[fetch])
            right = wf.step("right", queue=STEP_QUEUES["right"], payload={"work_ms": work_ms}, after=[fetch])
            wf.step("join", queue=STEP_QUEUES["join"], payload={"work_ms": work_ms}, after=[left, right])
            made = wf.enqueue(conn)
        else:
            payload = {"tag": self._name_of(item), "sequence": item[1], "n": item[2], "work_ms": work_ms}
            made = enqueue(conn, SEQ_QUEUE, payload, sequence=item[1]).id
        conn.commit()
        return made

    def _landed(self, conn: psycopg.Connection, item: tuple) -> int | None:
        """The id of an item whose commit was cut, if it committed after all (read on a new connection)."""
        from tools.chaos_workflow_handlers import SEQ_QUEUE

        if item[0] == "wf":
            row = conn.execute("SELECT id FROM outboxq_workflows WHERE name = %s", (self._name_of(item),)).fetchone()
        else:
            row = conn.execute("SELECT id FROM outboxq_jobs WHERE queue = %s AND payload->>'tag' = %s",
                               (SEQ_QUEUE, self._name_of(item))).fetchone()
        conn.rollback()
        self.cut_commits["landed" if row else "not landed"] += 1
        return row[0] if row else None

    def _enqueue_durably(self, conn: psycopg.Connection | None, item: tuple) -> psycopg.Connection:
        """Enqueue one item until it is committed. Where a commit was cut, whether it landed is read back first:
        enqueued again, a sequence's job would come after the ones enqueued meanwhile (and a workflow be twice)."""
        uncertain = False
        deadline = time.monotonic() + self.config.timeout_s
        while time.monotonic() < deadline:
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.app_url)
                made = self._landed(conn, item) if uncertain else None
                made = made if made is not None else self._write(conn, item)
            except psycopg.OperationalError:  # the server restarted: try again once it is back
                uncertain = True
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.2)
                continue
            with self._lock:
                if item[0] == "wf":
                    self.workflow_ids[self._name_of(item)] = made
                    self.workflow_bases[self._name_of(item)] = item[1] + 1
                else:
                    self.sequence_tags[self._name_of(item)] = (item[1], item[2])
            return conn
        raise RuntimeError(f"{item} could not be enqueued within {self.config.timeout_s} s")

    def _produce(self) -> None:
        items = self._items()
        step_s = 0.2
        per_step = max(1, -(-len(items) // max(1, int(self.more.workflow_duration_s * 0.75 / step_s))))
        conn: psycopg.Connection | None = None
        try:
            for start in range(0, len(items), per_step):
                for item in items[start:start + per_step]:
                    conn = self._enqueue_durably(conn, item)
                time.sleep(step_s)  # (a trickle: the pace of the load, not a wait)
        except Exception as exc:  # the scenario goes on and fails with what happened
            self.result.problems.append(f"producer stopped: {exc!r}")
        finally:
            if conn is not None:
                conn.close()

    # -- run
    def execute(self) -> ScenarioResult:
        started = self._produce_under_faults(self.more.workflow_duration_s)
        self._wait_all_ended()
        self._stop_processes()
        self.finish(started)
        self._check()
        return self.result

    def _wait_all_ended(self) -> None:
        """Until every job that was committed exists and is done, dead or cancelled (or the timeout)."""
        expected = 4 * len(self.workflow_ids) + len(self.sequence_tags)
        deadline = time.monotonic() + self.config.timeout_s
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.url) as conn:
                    total, unended = conn.execute(
                        "SELECT count(*), count(*) FILTER (WHERE status NOT IN ('done', 'dead', 'cancelled')) "
                        "FROM outboxq_jobs").fetchone()
                if total >= expected and not unended:
                    return
            except psycopg.OperationalError:
                pass  # the server is restarting
            time.sleep(0.5)

    # -- check
    def _check(self) -> None:
        from tools.chaos_workflow_handlers import SEQ_QUEUE

        r = self.result
        with psycopg.connect(self.url) as conn:
            jobs = conn.execute("SELECT id, queue, status, workflow_id, payload->>'tag' FROM outboxq_jobs").fetchall()
            effects = conn.execute("SELECT job_id, step, parents, value, at FROM chaos_wf_effects").fetchall()
            runs = conn.execute("SELECT job_id, sequence, n, started_at, ended_at FROM chaos_seq_runs").fetchall()
            workflows = {name: get_workflow(conn, wf_id) for name, wf_id in self.workflow_ids.items()}
        r.jobs = 4 * len(self.workflow_ids) + len(self.sequence_tags)
        r.lost = r.duplicated = r.not_finished = r.order_violations = 0
        self._check_workflows(workflows, effects)
        self._check_sequences([j for j in jobs if j[1] == SEQ_QUEUE], runs)
        known = set(self.workflow_ids.values())
        strangers = sum(1 for j in jobs if j[3] not in known if j[3] is not None or j[4] not in self.sequence_tags)
        if strangers:
            r.problems.append(f"{strangers} jobs exist that no producer committed")
        r.details += [("enqueues whose commit was cut: landed / not landed",
                       f"{self.cut_commits['landed']} / {self.cut_commits['not landed']}"),
                      ("fenced (zombie) writes refused", self.report.zombie_writes_refused)]
        if self.order_examples:
            r.details.append(("order violations (first 5)", "; ".join(self.order_examples[:5])))
        for name in ("lost", "duplicated", "not_finished", "order_violations"):
            if getattr(r, name):
                r.problems.append(f"{name}: {getattr(r, name)}")

    def _check_workflows(self, workflows: dict[str, Any], effects: list[tuple]) -> None:
        """Every workflow done, each step's effect once, each step after those before it with their values."""
        r = self.result
        by_job: dict[int, list[tuple]] = defaultdict(list)
        for effect in effects:
            by_job[effect[0]].append(effect)
        results_missing = 0
        for name, info in workflows.items():
            if info is None:
                r.lost += 4
                continue
            r.not_finished += info.status != "done"
            first: dict[str, tuple] = {}
            for s in info.steps:
                rows = by_job.pop(s.job_id, [])
                r.lost += not rows
                r.duplicated += max(0, len(rows) - 1)
                if rows:
                    first[s.name] = min(rows, key=lambda e: e[4])
                results_missing += s.status == "done" and not (isinstance(s.result, dict) and s.result.get("value") is not None)
            r.order_violations += self._diamond_violations(name, first)
        if by_job:
            r.problems.append(f"{len(by_job)} effects of jobs that are no committed workflow's steps")
        done = sum(1 for info in workflows.values() if info is not None and info.status == "done")
        r.details += [("workflows done / committed", f"{done} / {len(workflows)}"),
                      ("steps done whose result was not stored", results_missing)]

    def _diamond_violations(self, name: str, first: dict[str, tuple]) -> int:
        """Steps of one diamond that wrote their effect before a step they come after, or saw a parent's result
        other than that step's value (a missing result included), or computed a wrong value."""
        from tools.chaos_workflow_handlers import left_value, right_value

        base = self.workflow_bases[name]
        expected = {"fetch": base, "left": left_value(base), "right": right_value(base)}
        expected["join"] = expected["left"] + expected["right"]
        violations = 0
        for step, before in (("fetch", ()), ("left", ("fetch",)), ("right", ("fetch",)), ("join", ("left", "right"))):
            effect = first.get(step)
            if effect is None:
                continue
            seen = {p: (effect[2].get(p) or {}).get("value") for p in before}
            early = [p for p in before if p not in first or first[p][4] >= effect[4]]
            if early or seen != {p: expected[p] for p in before} or effect[3] != expected[step]:
                violations += 1
                self.order_examples.append(f"{name}/{step}: saw {seen}, wrote {effect[3]} (want {expected[step]})"
                                           + (f", before {early}" if early else ""))
        return violations

    def _check_sequences(self, jobs: list[tuple], runs: list[tuple]) -> None:
        """Each sequence job done with its run once; each sequence's runs in n order, none overlapping."""
        r = self.result
        runs_per_job = Counter(run[0] for run in runs)
        present = {job[4] for job in jobs}
        r.lost += sum(1 for tag in self.sequence_tags if tag not in present)
        r.lost += sum(1 for job in jobs if not runs_per_job[job[0]])
        r.duplicated += sum(n - 1 for n in runs_per_job.values() if n > 1)
        r.not_finished += sum(1 for job in jobs if job[2] != "done")
        by_sequence: dict[str, list[tuple]] = defaultdict(list)
        for run in runs:
            by_sequence[run[1]].append(run)
        for sequence, seq_runs in sorted(by_sequence.items()):
            seq_runs.sort(key=lambda run: (run[3], run[2]))
            for before, after in zip(seq_runs, seq_runs[1:], strict=False):
                if after[2] < before[2] or before[4] > after[3]:
                    r.order_violations += 1
                    self.order_examples.append(f"{sequence}: n={before[2]} ran {before[3]:%H:%M:%S.%f}–"
                                               f"{before[4]:%H:%M:%S.%f}, n={after[2]} from {after[3]:%H:%M:%S.%f}")
        r.details.append(("sequences: runs recorded / jobs committed",
                          f"{len(runs)} / {len(self.sequence_tags)} in {len(by_sequence)} sequences"))


SCENARIOS = {"periodic": PeriodicScenario, "limits": LimitsScenario, "poison": PoisonScenario,
             "spark": SparkScenario, "workflows": WorkflowsScenario}


def run_more(name: str, config: MoreConfig, out=sys.stdout) -> ScenarioResult:
    """Run one added scenario and return its result (its database is dropped afterwards)."""
    scenario = SCENARIOS[name](config, out=out)
    print(f"chaos: scenario {name} …", file=out, flush=True)
    try:
        return scenario.execute()
    except Exception as exc:  # the scenario could not run to its end: a failure, with what happened
        scenario.result.problems.append(f"scenario aborted: {exc!r}")
        return scenario.result
    finally:
        for p in [*scenario.workers, *getattr(scenario, "drivers", [])]:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL) if p in getattr(scenario, "drivers", []) else p.kill()
                except ProcessLookupError:
                    pass
        scenario.cleanup()
        if scenario.pgdata is not None:
            from outboxq.embedded import stop_embedded

            try:
                stop_embedded(scenario.pgdata)
            except Exception:  # already stopped
                pass


TABLE_HEADER = ("scenario", "faults injected", "jobs", "lost", "duplicated", "not finished", "slot gaps",
                "limit exceeded", "order violations", "verdict")


def row_of_default(report: Any) -> ScenarioResult:
    """The default scenario's report as a row of the table."""
    return ScenarioResult("jobs", faults=report.faults, jobs=report.jobs_committed, lost=report.lost,
                          duplicated=report.duplicated_effects, not_finished=report.not_finished,
                          elapsed_s=report.elapsed_s, problems=list(report.problems))


def format_results(results: list[ScenarioResult]) -> str:
    """Each scenario's details, then one table row per scenario (Markdown, as the README shows it)."""
    lines = []
    for r in results:
        details = [("faults injected", ", ".join(f"{k} {v}" for k, v in sorted(r.faults.items())) or "none"),
                   *r.details, ("elapsed", f"{r.elapsed_s} s")]
        width = max(len(k) for k, _ in details)
        lines.append(f"== {r.scenario}")
        lines += [f"{k:<{width}}  {v}" for k, v in details]
        lines.append("VERDICT: " + ("OK, every invariant held" if r.ok else "FAILED: " + "; ".join(r.problems)))
        lines.append("")
    lines.append("| " + " | ".join(TABLE_HEADER) + " |")
    lines.append("|" + "|".join(" --- " for _ in TABLE_HEADER) + "|")
    for r in results:
        cells = (r.scenario, ", ".join(f"{k} {v}" for k, v in sorted(r.faults.items())) or "none", r.jobs, r.lost,
                 r.duplicated, r.not_finished, r.gaps, r.limit_exceeded, r.order_violations,
                 "OK" if r.ok else "FAILED")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)
