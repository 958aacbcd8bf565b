"""`python -m tools chaos`: a bounded fault-injection scenario that proves nothing is lost and nothing runs twice.

Jobs are enqueued from Python (in transactions of which some roll back) and over HTTP (with Idempotency-Key
retries) while worker processes run handlers that write their effects with ctx.transaction(). Faults are
injected meanwhile: SIGKILL of a worker (restarted), pg_terminate_backend of workers' connections, a
PostgreSQL restart (when the scenario owns the server), a worker frozen with SIGSTOP past its lease and
resumed (the zombie), and a restart of the API process. At the end every invariant is checked.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from outboxq import enqueue
from outboxq.db import url_with_database, url_with_user
from outboxq.queue.migrate import upgrade
from outboxq.queue.roles import create_app_role, drop_app_role

# tools/chaos_handlers.py (and the other scenarios' handler modules) are imported where a scenario uses them,
# never here: `python -m tools` imports this module to register `chaos`, and a handler module imported at that
# point would add its @consumer queues to the default registry of every process that imports this one
# (load_handler_modules serves the whole default registry). Only the scenario's workers import them, with
# `--handlers tools.chaos_handlers` and the repository's root on PYTHONPATH.

ROOT = Path(__file__).resolve().parents[1]
WORKER_APP_NAME = "outboxq-chaos-worker"
FAULT_KINDS = ("kill", "terminate", "pg_restart", "zombie", "api_restart")
FAULTS_UNTIL_FINISHED = 0.8  # faults are injected until this share of the committed jobs has finished


@dataclass
class ChaosConfig:
    """What the scenario runs: how many jobs and workers, which faults, for how long at most."""

    jobs: int = 20_000
    workers: int = 3
    http_fraction: float = 0.1
    faults: tuple[str, ...] = FAULT_KINDS
    fault_interval_s: float = 2.0
    timeout_s: float = 600.0
    seed: int = 1
    database_url: str | None = None  # a server URL; None: a private embedded server the scenario owns


@dataclass
class ChaosReport:
    """Figures and verdict of one scenario run."""

    jobs_committed: int = 0
    jobs_rolled_back: int = 0
    jobs_over_http: int = 0
    faults: Counter = field(default_factory=Counter)
    lost: int = 0
    phantom: int = 0
    duplicated_effects: int = 0
    not_finished: int = 0
    dead_as_meant: int = 0
    dependency_order_violations: int = 0
    zombie_writes_refused: int = 0
    recovery_s: float = 0.0
    elapsed_s: float = 0.0
    throughput_jobs_s: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every invariant held."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """Plain values (for --json)."""
        out = asdict(self)
        out["faults"] = dict(self.faults)
        out["ok"] = self.ok
        return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Scenario:
    """One run: owns the database (and maybe the server), the worker and API processes, and the faults."""

    def __init__(self, config: ChaosConfig, out=sys.stdout):
        self.config = config
        self.out = out
        self.rng = random.Random(config.seed)
        self.report = ChaosReport()
        self.run = uuid.uuid4().hex[:8]
        self.committed: dict[str, str] = {}  # tag -> queue
        self.rolled_back: set[str] = set()
        self.maybe_committed: set[str] = set()  # the connection broke around commit: fate unknown
        self.dependencies: list[tuple[str, str]] = []  # (dependent tag, dependency tag)
        self.workers: list[subprocess.Popen] = []
        self.api: subprocess.Popen | None = None
        self.api_port = _free_port()
        self.api_token = uuid.uuid4().hex
        self.pgdata: Path | None = None
        self.log_dir = Path(tempfile.mkdtemp(prefix="outboxq-chaos-logs-"))
        self._stop_faults = threading.Event()
        self._lock = threading.Lock()
        self.last_fault_at = 0.0

    # ------------------------------------------------------------------ set-up

    def _server_url(self) -> str:
        if self.config.database_url:
            return self.config.database_url
        from outboxq.embedded import start_embedded

        self.pgdata = Path(tempfile.mkdtemp(prefix="outboxq-chaos-pg-")) / "pgdata"
        return start_embedded(self.pgdata, cleanup_mode="delete")

    def setup(self) -> None:
        server = self._server_url()
        name = f"outboxq_chaos_{self.run}"
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.server_url = server
        self.url = url_with_database(server, name)
        upgrade(self.url)
        from tools.chaos_handlers import EFFECTS_TABLE_DDL

        # Workers and the API run as the least-privilege role, as a deployment should.
        self.app_role = f"outboxq_chaos_app_{self.run}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(EFFECTS_TABLE_DDL)
            create_app_role(conn, self.app_role)
            conn.execute(f'GRANT SELECT, INSERT ON chaos_effects TO "{self.app_role}"')
        self.app_url = url_with_user(self.url, self.app_role)
        for i in range(self.config.workers):
            self.workers.append(self._start_worker(i))
        if self.config.http_fraction > 0 or "api_restart" in self.config.faults:
            self._start_api()

    def _env(self) -> dict[str, str]:
        from tools.chaos_handlers import CHAOS_LEASE_S

        return {**os.environ, "DATABASE_URL": self.app_url, "PYTHONPATH": str(ROOT),
                "OUTBOXQ_POLL_INTERVAL": "0.2", "OUTBOXQ_LEASE_S": str(CHAOS_LEASE_S),
                # rescue uses the settings' backoff: keep the scenario's retries quick
                "OUTBOXQ_BACKOFF_BASE": "0.2", "OUTBOXQ_BACKOFF_MAX": "2"}

    def _start_worker(self, index: int) -> subprocess.Popen:
        log = open(self.log_dir / f"worker-{index}-{time.monotonic_ns()}.log", "w")
        return subprocess.Popen(
            [sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "worker", "--processes", "1",
             "--handlers", "tools.chaos_handlers", "--concurrency", "8", "--batch-size", "100"],
            env={**self._env(), "PGAPPNAME": WORKER_APP_NAME}, cwd=ROOT, stdout=log, stderr=log,
        )

    def _start_api(self) -> None:
        log = open(self.log_dir / f"api-{time.monotonic_ns()}.log", "w")
        self.api = subprocess.Popen(
            [sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "serve", "--host", "127.0.0.1",
             "--port", str(self.api_port)],
            env={**self._env(), "OUTBOXQ_API_TOKENS": f"{self.api_token}:admin"}, cwd=ROOT, stdout=log,
            stderr=log,
        )

    # ------------------------------------------------------------------ load

    def _python_producer(self, count: int) -> None:
        made = 0
        conn: psycopg.Connection | None = None
        while made < count:
            size = min(count - made, self.rng.randint(1, 40))
            tags: dict[str, str] = {}
            keyed: list[str] = []  # chaos-a jobs of this transaction that have a key (to depend on)
            deps: list[tuple[str, str]] = []
            roll_back = self.rng.random() < 0.1
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.app_url)
                for _ in range(size):
                    tag = f"{self.run}-{uuid.uuid4().hex[:12]}"
                    kind = self.rng.random()
                    if kind < 0.5:
                        # Some jobs work longer, so that frozen or killed workers hold jobs mid-handler.
                        work_ms = 200 if self.rng.random() < 0.05 else 2
                        queue, payload, options = "chaos-a", {"tag": tag, "work_ms": work_ms}, {"key": tag}
                        keyed.append(tag)
                    elif kind < 0.75:
                        queue, payload, options = "chaos-b", {"tag": tag, "fail_first": self.rng.random() < 0.3}, {}
                    elif kind < 0.85 and keyed:
                        dependency = keyed[-1]
                        queue, payload, options = "chaos-c", {"tag": tag}, {"depends_on": [("chaos-a", dependency)]}
                        deps.append((tag, dependency))
                    elif kind < 0.99:
                        queue, payload, options = "chaos-a", {"tag": tag}, {"delay": self.rng.random() * 2}
                    else:
                        queue, payload, options = "chaos-dead", {"tag": tag}, {}
                    enqueue(conn, queue, payload, **options)
                    tags[tag] = queue
                if roll_back:
                    conn.rollback()
                    with self._lock:
                        self.rolled_back.update(tags)
                else:
                    conn.commit()
                    with self._lock:
                        self.committed.update(tags)
                        self.dependencies.extend(deps)
                made += size
            except psycopg.OperationalError:
                # The server restarted or our connection was cut. Before the commit the transaction is
                # simply gone; if the commit itself was cut its fate is unknown, so these tags are
                # "maybe": never counted as lost, but if their jobs exist they must run exactly once.
                with self._lock:
                    self.maybe_committed.update(tags)
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.2)
        if conn is not None:
            conn.close()

    def _http_producer(self, count: int) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {self.api_token}"}
        base = f"http://127.0.0.1:{self.api_port}"
        with httpx.Client(timeout=10) as client:
            for _ in range(count):
                tag = f"{self.run}-h{uuid.uuid4().hex[:11]}"
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:  # the same Idempotency-Key on every retry
                    try:
                        r = client.post(f"{base}/v1/queues/chaos-a/jobs", json={"payload": {"tag": tag}},
                                        headers={**headers, "Idempotency-Key": tag})
                        if r.status_code in (200, 201):
                            with self._lock:
                                self.committed[tag] = "chaos-a"
                                self.report.jobs_over_http += 1
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.1)
                else:
                    self.report.problems.append(f"HTTP enqueue of {tag} never succeeded")

    # ------------------------------------------------------------------ faults

    def _fault_loop(self) -> None:
        kinds = [k for k in self.config.faults if k != "pg_restart" or self.pgdata is not None]
        kinds = [k for k in kinds if k != "api_restart" or self.api is not None]
        # Faults go on while producers run, and at least until every kind was injected once.
        while kinds and not self._stop_faults.wait(self.config.fault_interval_s) or (
            kinds and any(self.report.faults[k] == 0 for k in kinds)
        ):
            kind = kinds[self.report.faults.total() % len(kinds)]
            try:
                self.last_fault_at = time.monotonic()
                getattr(self, f"_fault_{kind}")()
                self.report.faults[kind] += 1
            except Exception as exc:  # a fault that could not be injected is reported, not fatal
                self.report.problems.append(f"fault {kind} could not be injected: {exc!r}")

    def _fault_kill(self) -> None:
        index = self.rng.randrange(len(self.workers))
        self.workers[index].kill()
        self.workers[index].wait()
        self.workers[index] = self._start_worker(index)

    def _fault_terminate(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                         (WORKER_APP_NAME,))

    def _fault_pg_restart(self) -> None:
        from outboxq.embedded import restart_embedded

        assert self.pgdata is not None
        restart_embedded(self.pgdata)

    def _fault_zombie(self) -> None:
        from tools.chaos_handlers import CHAOS_LEASE_S

        # Freeze a worker that holds running jobs, so that it has late writes to be refused.
        by_pid = {w.pid: w for w in self.workers}
        with psycopg.connect(self.url, autocommit=True) as conn:
            holders = [int(r[0].split(":")[1]) for r in conn.execute(
                "SELECT DISTINCT worker_id FROM outboxq_jobs WHERE status = 'running'").fetchall()]
        candidates = [by_pid[pid] for pid in holders if pid in by_pid]
        worker = self.rng.choice(candidates or self.workers)
        worker.send_signal(signal.SIGSTOP)
        time.sleep(CHAOS_LEASE_S * 2 + 1)  # past its lease: its jobs get rescued by the others
        worker.send_signal(signal.SIGCONT)

    def _fault_api_restart(self) -> None:
        assert self.api is not None
        self.api.terminate()
        self.api.wait(timeout=30)
        self._start_api()

    # ------------------------------------------------------------------ run and check

    def execute(self) -> ChaosReport:
        started = time.monotonic()
        self.setup()
        if self.api is not None:
            self._wait_for_api()
        http_jobs = int(self.config.jobs * self.config.http_fraction) if self.api is not None else 0
        producers = [threading.Thread(target=self._python_producer, args=(self.config.jobs - http_jobs,))]
        if http_jobs:
            producers.append(threading.Thread(target=self._http_producer, args=(http_jobs,)))
        faults = threading.Thread(target=self._fault_loop)
        for t in [*producers, faults]:
            t.start()
        for t in producers:
            t.join()
        print(f"enqueued: {len(self.committed)} committed, {len(self.rolled_back)} rolled back", file=self.out)
        finished_at = self._wait_until_finished(started)
        self._stop_faults.set()
        faults.join()
        self.report.elapsed_s = round(finished_at - started, 2)
        self.report.recovery_s = round(max(0.0, finished_at - self.last_fault_at), 2) if self.last_fault_at else 0.0
        self.report.throughput_jobs_s = round(len(self.committed) / max(self.report.elapsed_s, 0.001), 1)
        self._stop_processes()
        self._check()
        return self.report

    def _wait_for_api(self) -> None:
        import httpx

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.api_port}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.report.problems.append("the API did not start")
        self.api = None

    def _wait_until_finished(self, started: float) -> float:
        while time.monotonic() - started < self.config.timeout_s:
            try:
                with psycopg.connect(self.url) as conn:
                    unfinished = conn.execute(
                        "SELECT count(*) FROM outboxq_jobs WHERE status NOT IN ('done', 'dead', 'cancelled')"
                    ).fetchone()[0]
                    total = conn.execute("SELECT count(*) FROM outboxq_jobs").fetchone()[0]
                print(f"\r  finished {total - unfinished}/{total}", end="", file=self.out, flush=True)
                if total and (total - unfinished) >= FAULTS_UNTIL_FINISHED * len(self.committed):
                    # From here on no more faults: the rest measures recovery.
                    self._stop_faults.set()
                if unfinished == 0 and total >= len(self.committed):
                    print(file=self.out)
                    return time.monotonic()
            except psycopg.OperationalError:
                pass  # the server is restarting
            time.sleep(0.5)
        print(file=self.out)
        self.report.problems.append(f"not everything finished within {self.config.timeout_s} s")
        return time.monotonic()

    def _stop_processes(self) -> None:
        for w in self.workers:
            w.send_signal(signal.SIGCONT)
            w.send_signal(signal.SIGTERM)
        for w in self.workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()
        if self.api is not None:
            self.api.terminate()
            self.api.wait(timeout=30)
        self.report.zombie_writes_refused = sum(
            p.read_text(errors="replace").count("fenced") for p in self.log_dir.glob("worker-*.log")
        )

    def _check(self) -> None:
        r = self.report
        r.jobs_committed = len(self.committed)
        r.jobs_rolled_back = len(self.rolled_back)
        with psycopg.connect(self.url) as conn:
            jobs = {tag: (status, queue) for tag, status, queue in conn.execute(
                "SELECT payload->>'tag', status, queue FROM outboxq_jobs").fetchall()}
            effect_counts = dict(conn.execute("SELECT tag, count(*) FROM chaos_effects GROUP BY tag").fetchall())
            first_effect = dict(conn.execute("SELECT tag, min(id) FROM chaos_effects GROUP BY tag").fetchall())
        maybe = self.maybe_committed
        r.lost = sum(1 for tag in self.committed if tag not in jobs)
        r.phantom = sum(1 for tag in self.rolled_back if tag in jobs)
        r.duplicated_effects = sum(n - 1 for n in effect_counts.values() if n > 1)
        for tag, (status, queue) in jobs.items():
            meant_dead = queue == "chaos-dead"
            if meant_dead and status == "dead":
                r.dead_as_meant += 1
            elif meant_dead or status != "done":
                r.not_finished += 1
            elif tag not in effect_counts:
                r.problems.append(f"job {tag} is done but its effect is missing")
        unknown = [t for t in jobs if t not in self.committed and t not in maybe]
        if unknown:
            r.problems.append(f"{len(unknown)} jobs exist that no producer committed")
        r.dependency_order_violations = sum(
            1 for dependent, dependency in self.dependencies
            if first_effect.get(dependent) is not None
            and (first_effect.get(dependency) is None or first_effect[dependency] > first_effect[dependent])
        )
        for name in ("lost", "phantom", "duplicated_effects", "not_finished", "dependency_order_violations"):
            if getattr(r, name):
                r.problems.append(f"{name}: {getattr(r, name)}")

    def cleanup(self) -> None:
        """Drop the scenario's database (the private server, if any, goes when this process exits)."""
        try:
            with psycopg.connect(self.server_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "outboxq_chaos_{self.run}" WITH (FORCE)')
                if getattr(self, "app_role", None):
                    drop_app_role(conn, self.app_role)
        except (psycopg.Error, AttributeError):
            pass


def run_chaos(config: ChaosConfig, out=sys.stdout) -> ChaosReport:
    """Run one scenario and return its report (the database is dropped afterwards)."""
    scenario = Scenario(config, out=out)
    try:
        return scenario.execute()
    finally:
        for w in scenario.workers:
            if w.poll() is None:
                w.kill()
        if scenario.api is not None and scenario.api.poll() is None:
            scenario.api.kill()
        scenario.cleanup()
        if scenario.pgdata is not None:
            from outboxq.embedded import stop_embedded

            try:
                stop_embedded(scenario.pgdata)
            except Exception:  # already stopped
                pass


def format_report(report: ChaosReport) -> str:
    """The verdict as a small table."""
    rows = [
        ("jobs committed (python + http)", f"{report.jobs_committed} ({report.jobs_over_http} over HTTP)"),
        ("jobs rolled back", report.jobs_rolled_back),
        ("faults injected", ", ".join(f"{k} {v}" for k, v in sorted(report.faults.items())) or "none"),
        ("jobs lost", report.lost),
        ("rolled-back jobs that exist", report.phantom),
        ("effects duplicated", report.duplicated_effects),
        ("jobs not finished", report.not_finished),
        ("dead as meant", report.dead_as_meant),
        ("dependency order violations", report.dependency_order_violations),
        ("fenced (zombie) writes refused", report.zombie_writes_refused),
        ("recovery after last fault", f"{report.recovery_s} s"),
        ("elapsed / throughput under faults", f"{report.elapsed_s} s / {report.throughput_jobs_s} jobs/s"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append("VERDICT: " + ("OK, every invariant held" if report.ok else "FAILED: " + "; ".join(report.problems)))
    return "\n".join(lines)


SCENARIO_CHOICES = ("jobs", "periodic", "limits", "poison", "spark", "workflows", "all")


def cmd_chaos(args: argparse.Namespace) -> int:
    """Run the scenario (or scenarios) from the command line."""
    if args.scenario != "jobs":
        return _cmd_more(args)
    faults = tuple(k for k in FAULT_KINDS if not getattr(args, f"no_{k}"))
    config = ChaosConfig(jobs=args.jobs, workers=args.workers, faults=faults, seed=args.seed,
                         fault_interval_s=args.fault_interval, timeout_s=args.timeout,
                         http_fraction=args.http_fraction, database_url=args.database_url)
    report = run_chaos(config, out=sys.stderr if args.json else sys.stdout)
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_report(report))
    return 0 if report.ok else 1


def _cmd_more(args: argparse.Namespace) -> int:
    """--scenario periodic|limits|poison|spark|workflows|all: the added scenarios (tools/chaos_more.py), a row each."""
    from tools.chaos_more import MoreConfig, format_results, row_of_default, run_more

    out = sys.stderr if args.json else sys.stdout
    results = []
    if args.scenario == "all":
        faults = tuple(k for k in FAULT_KINDS if not getattr(args, f"no_{k}"))
        report = run_chaos(ChaosConfig(jobs=args.jobs, workers=args.workers, faults=faults, seed=args.seed,
                                       fault_interval_s=args.fault_interval, timeout_s=args.timeout,
                                       http_fraction=args.http_fraction, database_url=args.database_url), out=out)
        print(format_report(report), file=out)
        results.append(row_of_default(report))
    config = MoreConfig(workers=args.workers, duration_s=args.duration, limit_jobs=args.limit_jobs,
                        poison_jobs=args.poison_jobs, spark_jobs=args.spark_jobs, workflows=args.workflows,
                        sequences=args.sequences, sequence_jobs=args.sequence_jobs,
                        workflow_duration_s=args.workflow_duration,
                        fault_interval_s=args.fault_interval, timeout_s=args.timeout, seed=args.seed,
                        database_url=args.database_url)
    every = ("periodic", "limits", "poison", "spark", "workflows")
    for name in every if args.scenario == "all" else (args.scenario,):
        results.append(run_more(name, config, out=out))
    print(json.dumps([r.to_dict() for r in results], indent=2, default=str) if args.json
          else format_results(results))
    return 0 if all(r.ok for r in results) else 1


def register(sub: Any) -> None:
    """Add `python -m tools chaos` to the CLI."""
    p = sub.add_parser("chaos", help="fault-injection scenario: nothing lost, nothing run twice")
    p.add_argument("--scenario", choices=SCENARIO_CHOICES, default="jobs",
                   help="jobs (the default: plain jobs), periodic (schedules), limits (concurrency limits), "
                   "poison (handlers returning and raising hostile values), spark (two drivers, one killed), "
                   "workflows (diamond workflows and sequences), or all of them")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--duration", type=float, default=60.0,
                   help="periodic, limits and poison: seconds of faults")
    p.add_argument("--limit-jobs", type=int, default=1200, help="limits: jobs enqueued over --duration")
    p.add_argument("--poison-jobs", type=int, default=2000,
                   help="poison: jobs enqueued over --duration, one in ten poisoned")
    p.add_argument("--spark-jobs", type=int, default=600, help="spark: jobs for the two drivers")
    p.add_argument("--workflows", type=int, default=60,
                   help="workflows: diamond workflows (4 steps each) enqueued over --workflow-duration")
    p.add_argument("--sequences", type=int, default=4, help="workflows: sequences enqueued alongside")
    p.add_argument("--sequence-jobs", type=int, default=15, help="workflows: jobs per sequence")
    p.add_argument("--workflow-duration", type=float, default=20.0, help="workflows: seconds of faults")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--http-fraction", type=float, default=0.1)
    p.add_argument("--fault-interval", type=float, default=2.0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--database-url", help="a server to create the scenario's database on "
                   "(default: a private embedded server, which also allows the restart fault)")
    for kind in FAULT_KINDS:
        p.add_argument(f"--no-{kind.replace('_', '-')}", dest=f"no_{kind}", action="store_true",
                       help=f"do not inject {kind} faults")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_chaos)
