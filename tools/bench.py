"""`python -m tools bench`: throughput, enqueue cost, latency and scale, measured side by side with the peers.

Sub-benchmarks (see bench/README.md for the method and the latest figures):

- drain:   N no-op jobs (default 50,000) drained by a worker with outboxq's default settings;
           wall time from "go" to the moment the database says every job is finished.
- enqueue: single-job enqueue + commit against a bare one-row INSERT + commit on the same connection;
           enqueue_many in 10,000-job batches; the HTTP batch route against the Python path.
- latency: an idle worker; enqueue + commit → handler start, p50 / p99 over 1,000 samples (--latency-samples).
- backlog: drain throughput at a large backlog (default 1,000,000) with the worker's RSS at start and
           end; the claim query's plan and a drain with many finished jobs kept (default 5,000,000),
           alternating 3 times with the baseline drain (medians).
- manyqueues: the drain's N jobs in 1 queue against the same N spread over 50 queues (one consumer each).
- deadrows: a drain of --dead-rows-jobs (default 500,000) while another session holds a REPEATABLE READ
           transaction open throughout (vacuum cannot remove dead row versions), against the same drain
           without it.
- features: a workflow step's hand-off and a sequence's throughput, a Spark streaming micro-batch against
           `outboxq spark run`, ten open dashboards' load on the server (tools/bench_features.py).

`--compare` runs the same drain, enqueue and latency through PgQueuer and Procrastinate, installed in a
separate virtual environment that this command creates when it is missing (never a dependency of
outboxq), on the same server, alternating the systems in each round; plus a pgbench ceiling.

Every worker runs in its own process (tools/bench_drivers.py), started the same way for each system.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import queue as queue_module
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import orjson
import psycopg

from outboxq.progress import Progress
from outboxq.queue.enqueue import enqueue_many
from outboxq.workers.processes import default_count
from tools.bench_drivers import QUEUE, bench_limit_keys
from tools.bench_features import render_features, run_features
from tools.bench_http import (
    BENCH_BATCH_PATH,
    HTTP_ROUNDS,
    api_process,
    batch_headers,
    free_port,
    post_batch,
)
from tools.bench_variants import Variant, parse_variant, prepare

DRIVERS = Path(__file__).with_name("bench_drivers.py")
DEFAULT_PEERS_VENV = "/tmp/peers-venv"
PEER_PACKAGES = ["pgqueuer[asyncpg]", "procrastinate", "uvloop"]
DB_PREFIX = "outboxq_bench"
SUB_BENCHMARKS = ("drain", "enqueue", "latency", "backlog", "manyqueues", "deadrows", "features")
MANY_QUEUES = 50
DONE_POLL_S = 0.005
SINGLE_ENQUEUE_BLOCKS = 6  # outboxq's and PgQueuer's single enqueue alternate in this many blocks each
BACKLOG_PAIRS = 3  # the drain beside the finished jobs and a baseline drain alternate this many times


def flow_drains(jobs: int) -> list[tuple[str, str, int, dict[str, Any]]]:
    """The flow-control drains of `--limits`: (name, label, jobs, flow)."""
    return [
        ("outboxq_gc10000", "drain outboxq global_concurrency=10000 (not binding)", jobs,
         {"consumer": {"global_concurrency": 10_000}}),
        ("outboxq_per_key_gc10000", "drain outboxq limit_by, 100 keys, global_concurrency=10000 per key "
         "(not binding)", jobs, {"consumer": {"global_concurrency": 10_000, "limit_by": "k"}, "keys": 100}),
        ("outboxq_per_key_runs_gc10000", "drain outboxq limit_by, 100 keys in runs of 40 jobs, "
         "global_concurrency=10000 per key (not binding)", jobs,
         {"consumer": {"global_concurrency": 10_000, "limit_by": "k"}, "keys": 100, "key_run": 40}),
        ("outboxq_gc4_50ms", "drain outboxq global_concurrency=4, 100 jobs of 50 ms (allows 80 jobs/s)", 100,
         {"consumer": {"global_concurrency": 4}, "sleep": 0.05}),
        ("outboxq_gc4_50ms_running", "drain outboxq global_concurrency=4, 100 jobs of 50 ms enqueued at go to "
         "running workers (allows 80 jobs/s)", 100,
         {"consumer": {"global_concurrency": 4}, "sleep": 0.05, "running_at_go": True}),
        ("outboxq_rate200", "drain outboxq rate_limit=200/s, 5,000 no-op jobs", 5_000,
         {"consumer": {"rate_limit": "200/s"}}),
    ]

# What "nothing left to run" means for each system (cheap: partial indexes / an emptied table). One EXISTS per
# status, each read from its own partial index: with `status IN (...)` PostgreSQL scanned the whole table, and
# beside 5,000,000 finished jobs each check took 0.7 s of a core and ended the drain that late (issue 17's
# "history slows the drain" was mostly that).
UNFINISHED_SQL = {
    "outboxq": "SELECT EXISTS (SELECT 1 FROM outboxq_jobs WHERE status = 'queued') "
               "OR EXISTS (SELECT 1 FROM outboxq_jobs WHERE status = 'running') "
               "OR EXISTS (SELECT 1 FROM outboxq_jobs WHERE status = 'retrying')",
    "pgqueuer": "SELECT EXISTS (SELECT 1 FROM pgqueuer)",
    "procrastinate": "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))",
}


# ---------------------------------------------------------------- small helpers


def median(values: list[float]) -> float | None:
    """The median, or None for no values."""
    return statistics.median(values) if values else None


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank) of non-empty values."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run whose rate is the median of non-empty `runs` (the lower one of the middle two)."""
    return sorted(runs, key=lambda r: r["jobs_per_s"])[(len(runs) - 1) // 2]


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing."""
    return a / b if a and b else None


def paired_ratio(runs: list[Any], base_runs: list[Any]) -> float | None:
    """The median over the rounds of a drain's rate against another drain's rate in the same round: on a
    machine whose speed drifts between rounds this moves less than the ratio of the two medians."""
    return median([a["jobs_per_s"] / b["jobs_per_s"] for a, b in zip(runs, base_runs, strict=False)
                   if a and b and a.get("jobs_per_s") and b.get("jobs_per_s")])


def url_for(server_url: str, database: str) -> str:
    """The server URL pointing at `database`."""
    from outboxq.db import url_with_database

    return url_with_database(server_url, database)


class Server:
    """The PostgreSQL server the benchmarks run on: creates and drops their databases."""

    def __init__(self, url: str):
        from outboxq.db import normalize_url

        self.url = normalize_url(url)

    def admin(self) -> psycopg.Connection:
        """An autocommit connection to the maintenance database."""
        return psycopg.connect(url_for(self.url, "postgres"), autocommit=True)

    def recreate(self, name: str, template: str | None = None) -> str:
        """Drop and create database `name` (from `template`); returns its URL."""
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        return url_for(self.url, name)

    def drop(self, name: str) -> None:
        """Drop database `name` if it exists."""
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def facts(self) -> dict[str, Any]:
        """The server version and the settings that bound a queue's speed."""
        with self.admin() as conn:
            out = {"version": conn.execute("SHOW server_version").fetchone()[0]}  # type: ignore[index]
            for setting in ("synchronous_commit", "fsync", "shared_buffers", "max_connections"):
                out[setting] = conn.execute(f"SHOW {setting}").fetchone()[0]  # type: ignore[index]
        return out


def machine_facts() -> dict[str, Any]:
    """CPU, memory and Python of this machine."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_gb": memory_gb, "load_1m": load,
            "python": platform.python_version(), "platform": platform.platform()}


# ---------------------------------------------------------------- driver processes


class Driver:
    """One tools/bench_drivers.py process: JSON lines out, "go" / "stop" lines in."""

    def __init__(self, python: str, spec: dict[str, Any], log_dir: Path):
        self.spec = spec
        self.events: queue_module.SimpleQueue[dict[str, Any]] = queue_module.SimpleQueue()
        self.log_path = log_dir / f"{spec['system']}-{spec['action']}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in close()
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        if spec["system"] == "outboxq":
            env["DATABASE_URL"] = spec["url"]
            # (A variant's package first: it imports ahead of the installed one.)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [spec.get("import_root"), str(DRIVERS.parent.parent),
                                                              env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            # -P: the script's folder (app/, whose queue package would shadow the stdlib's) stays off sys.path
            [python, "-P", str(DRIVERS), json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, text=True, env=env, cwd=str(DRIVERS.parent.parent),
        )
        self.result: dict[str, Any] | None = None
        self.ready: dict[str, Any] | None = None
        self.last_progress: dict[str, Any] = {}
        self.max_rss_kb = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self.events.put(event)
        self.events.put({"event": "exit"})

    def send(self, line: str) -> None:
        """Write a control line ("go", "stop")."""
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def _handle(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        self.max_rss_kb = max(self.max_rss_kb, int(event.get("rss_kb") or 0))
        if kind == "ready":
            self.ready = event
        elif kind == "progress":
            self.last_progress = event
        elif kind == "result":
            self.result = event
        elif kind == "exit" and self.result is None:
            self.result = {"error": f"driver exited ({self.process.wait()}); see {self.log_path}:\n"
                                    + self.log_tail()}

    def pump(self, timeout: float = 0.0) -> None:
        """Handle every event that arrived (waiting up to `timeout` for the first)."""
        try:
            self._handle(self.events.get(timeout=timeout) if timeout > 0 else self.events.get_nowait())
        except queue_module.Empty:
            return
        while True:
            try:
                self._handle(self.events.get_nowait())
            except queue_module.Empty:
                return

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until the driver says ready (or fails)."""
        deadline = time.monotonic() + timeout
        while self.ready is None and self.result is None and time.monotonic() < deadline:
            self.pump(0.05)
        if self.ready is None:
            raise BenchError(f"{self.spec['system']} {self.spec['action']} did not get ready: "
                             + str((self.result or {}).get("error", "timeout")))

    def wait_result(self, timeout: float = 600.0) -> dict[str, Any]:
        """Block until the driver printed its result; raise BenchError on failure."""
        deadline = time.monotonic() + timeout
        while self.result is None and time.monotonic() < deadline:
            self.pump(0.05)
        self.close()
        if self.result is None:
            raise BenchError(f"{self.spec['system']} {self.spec['action']} gave no result in {timeout:.0f}s")
        if "error" in self.result:
            raise BenchError(f"{self.spec['system']} {self.spec['action']}: {self.result['error']}")
        return self.result

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of the driver's stderr."""
        try:
            self._log.flush()
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return ""

    def close(self) -> None:
        """Stop the process if it still runs and close its log."""
        if self.process.poll() is None:
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used (Linux /proc); 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot (/proc/stat)."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values) - idle) / tick, sum(values) / tick


def statement_kind(query: str) -> str:
    """Which of the worker's statements a pg_stat_activity query text is."""
    q = query.lstrip().lower()
    if q.startswith("commit"):
        return "commit"
    if "queue_state" in q:
        return "claim"
    if q.startswith("with done"):
        return "complete"
    if q.startswith("listen"):
        return "listen"
    if q.startswith("update outboxq_jobs j\nset lease_expires_at"):
        return "heartbeat"
    if q.startswith("with expired"):
        return "rescue"
    for kind in ("promote", "prune", "delete"):
        if kind in q[:200]:
            return kind
    return q.split(None, 1)[0] if q else "-"


class DrainProfiler:
    """Where a drain's time goes, seen from outside the worker (no change to the worker itself).

    - Samples pg_stat_activity of the run's database every `interval` seconds: per worker connection
      (named by the statements it runs: claim, complete, ...) the share of samples executing each
      statement, with its wait event, or idle (waiting for the worker's Python to send the next one).
    - CPU seconds used during the drain by the worker process(es), by the PostgreSQL backends serving
      the run's database, and by the whole machine (the rest is everything else, the sampler included).
    """

    def __init__(self, url: str, worker_pids: list[int], exclude_pids: list[int], interval: float = 0.01):
        self.url, self.worker_pids, self.interval = url, worker_pids, interval
        self.exclude = set(exclude_pids)
        self.samples = 0
        self.counts: dict[tuple[str, str], int] = {}
        self.roles: dict[int, str] = {}
        self.backend_cpu_start: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        """Take the CPU baselines and start sampling."""
        self.machine_start = machine_cpu_s()
        self.worker_cpu_start = sum(proc_cpu_s(p) for p in self.worker_pids)
        self.started = time.perf_counter()
        self._thread.start()

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            self.exclude.add(conn.info.backend_pid)
            query = ("SELECT pid, state, coalesce(wait_event_type || ':' || wait_event, ''), query "
                     "FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'")
            while not self._stop.is_set():
                rows = [r for r in conn.execute(query).fetchall() if r[0] not in self.exclude]
                self.samples += 1
                for pid, state, wait, text in rows:
                    if pid not in self.backend_cpu_start:
                        self.backend_cpu_start[pid] = proc_cpu_s(pid)
                    kind = statement_kind(text or "")
                    roles = {"claim": "dispatcher", "complete": "completer", "listen": "listener",
                             "heartbeat": "heartbeat", "rescue": "maintenance"}
                    if kind in roles and pid not in self.roles:
                        self.roles[pid] = roles[kind]
                    role = self.roles.get(pid, f"backend {pid}")
                    if state == "active":
                        what = f"executing {kind}" + (f" (wait {wait})" if wait else "")
                    elif state == "idle in transaction":
                        what = f"idle in transaction (after {kind})"
                    else:
                        what = "idle (waiting for the client)"
                    key = (role, what)
                    self.counts[key] = self.counts.get(key, 0) + 1
                self._stop.wait(self.interval)

    def stop(self) -> dict[str, Any]:
        """Stop sampling; the shares and the CPU split."""
        elapsed = time.perf_counter() - self.started
        machine_busy = machine_cpu_s()[0] - self.machine_start[0]
        worker_cpu = sum(proc_cpu_s(p) for p in self.worker_pids) - self.worker_cpu_start
        backend_cpu = sum(max(0.0, proc_cpu_s(pid) - start) for pid, start in self.backend_cpu_start.items())
        self._stop.set()
        self._thread.join(5)
        per_role: dict[str, dict[str, float]] = {}
        for (role, what), count in sorted(self.counts.items(), key=lambda kv: -kv[1]):
            per_role.setdefault(role, {})[what] = round(count / max(1, self.samples), 3)
        return {
            "wall_s": round(elapsed, 3), "samples": self.samples, "sample_interval_s": self.interval,
            "connections": {r: v for r, v in per_role.items() if not r.startswith("backend ") or
                            sum(v.values()) > 0.05},
            "cpu_s": {"worker_process": round(worker_cpu, 3), "postgres_backends": round(backend_cpu, 3),
                      "machine_busy": round(machine_busy, 3),
                      "other": round(machine_busy - worker_cpu - backend_cpu, 3),
                      "machine_capacity": round(elapsed * (os.cpu_count() or 1), 3)},
        }


class BenchError(RuntimeError):
    """A benchmark step that could not run."""


# ---------------------------------------------------------------- the bench


class Bench:
    """Runs the sub-benchmarks and collects their figures."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.server = Server(args.url)
        self.progress = Progress(not args.quiet)
        self.log_dir = Path(tempfile.mkdtemp(prefix="outboxq-bench-"))
        self.peers_python: str | None = None
        self.templates: dict[str, str] = {}
        self._variants: list[Variant] | None = None
        # Per invocation, so that two benches (or a bench and the smoke test) on one server never collide.
        self.prefix = f"{DB_PREFIX}_{os.getpid()}"
        self.results: dict[str, Any] = {
            "machine": machine_facts(), "server": self.server.facts(),
            "settings": {k: v for k, v in vars(args).items() if k not in ("func", "url")},
            "runs": [],
        }

    # ------------------------------------------------------------ databases

    def template(self, system: str) -> str:
        """A database with `system`'s schema installed, cloned for every run."""
        if system in self.templates:
            return self.templates[system]
        name = f"{self.prefix}_{system}_tmpl"
        url = self.server.recreate(name)
        if system == "outboxq":
            import logging

            from outboxq.queue.migrate import upgrade

            logging.getLogger("alembic").setLevel(logging.WARNING)
            upgrade(url)
        else:
            self.driver(system, "setup", url).wait_result(120)
        self.templates[system] = name
        return name

    def fresh_db(self, system: str, suffix: str = "run") -> str:
        """A new database for one run, cloned from the system's template."""
        return self.server.recreate(f"{self.prefix}_{system}_{suffix}", self.template(system))

    def variants(self) -> list[Variant]:
        """The --variant revisions, exported into this run's scratch folder (once)."""
        if self._variants is None:
            names = [name for name, _rev in self.args.variant]
            if len(set(names)) < len(names):
                raise BenchError(f"each --variant needs a name of its own, not {', '.join(names)}")
            try:
                self._variants = [prepare(name, rev, self.log_dir / "variants") for name, rev in self.args.variant]
            except ValueError as exc:
                raise BenchError(str(exc)) from None
        return self._variants

    def cleanup(self) -> None:
        """Drop every database this run made."""
        with self.server.admin() as conn:
            names = [r[0] for r in conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s", (self.prefix + "\\_%",))]
        for name in names:
            self.server.drop(name)
        shutil.rmtree(self.log_dir, ignore_errors=True)

    # ------------------------------------------------------------ drivers

    def python_for(self, system: str) -> str:
        """outboxq's own interpreter, or the peers' virtual environment's."""
        if system == "outboxq":
            return sys.executable
        if self.peers_python is None:
            self.peers_python = ensure_peers_venv(Path(self.args.peers_venv), self.progress)
        return self.peers_python

    def driver(self, system: str, action: str, url: str, **spec: Any) -> Driver:
        """Start one driver process."""
        return Driver(self.python_for(system), {"system": system, "action": action, "url": url, **spec},
                      self.log_dir)

    # ------------------------------------------------------------ drain

    def drain(self, system: str, n: int, label: str, *, worker: dict[str, Any] | None = None,
              processes: int = 1, db_url: str | None = None, fill: bool = True,
              profile: str | None = None, flow: dict[str, Any] | None = None, queues: int = 1,
              hold_snapshot: bool = False, variant: Variant | None = None) -> dict[str, Any]:
        """Fill a fresh database with `n` no-op jobs, then time `processes` workers draining them.

        `profile`: "sample" samples the server side and the CPU split while draining (DrainProfiler);
        "cprofile" also runs the worker's threads under cProfile (outboxq only; slower).
        `flow` (outboxq only, issue 14): {"consumer": flow-control options of the consumer, "keys": limit keys
        the jobs cycle through, "key_run": how many jobs in a row have one key (default 1), "sleep": seconds each
        handler sleeps, "running_at_go": the workers start before "go", idle, and the clock includes enqueueing
        the jobs (one transaction) at "go"}.
        `queues` (outboxq only): the jobs spread over that many queues, a consumer each. `hold_snapshot`: another
        session holds a REPEATABLE READ transaction open from before "go" to the end of the drain. `variant`: the
        workers run that revision of outboxq (tools/bench_variants.py); the jobs are enqueued as ever.
        """
        flow = flow or {}
        if variant is not None:
            label = f"{label} @{variant.name} ({variant.rev})"
        running_at_go = bool(flow.get("running_at_go"))
        if running_at_go and queues != 1:
            raise BenchError(f"{label}: jobs enqueued at go go to one queue")
        url = db_url or self.fresh_db(system)
        fill_result = None
        if fill and not running_at_go:
            self.progress.update(f"{label}: enqueueing {n:,} jobs", force=True)
            fill_result = self.driver(system, "fill", url, n=n, keys=flow.get("keys", 0),
                                      key_run=flow.get("key_run", 1), queues=queues).wait_result(1800)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ANALYZE")  # as autovacuum would have done for a backlog that built up
        extra: dict[str, Any] = {}
        if profile == "cprofile":
            path = (Path(self.args.output).with_suffix(".drain.pstats") if self.args.output
                    else self.log_dir / "drain.pstats")
            extra = {"profile": "cprofile", "profile_path": str(path.resolve())}
        if variant is not None:
            extra["import_root"] = str(variant.import_root)
        drivers = [self.driver(system, "drain", url, worker=worker or {}, consumer=flow.get("consumer", {}),
                               sleep=flow.get("sleep", 0.0), queues=queues, running_at_go=running_at_go, **extra)
                   for _ in range(processes)]
        profiler: DrainProfiler | None = None
        holder: psycopg.Connection | None = None
        try:
            if hold_snapshot:  # its snapshot's xmin holds back vacuum (and pruning) for the whole drain
                holder = psycopg.connect(url)
                holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                holder.execute("SELECT count(*) FROM outboxq_queues").fetchone()
            for d in drivers:
                d.wait_ready()
            rss_start = sum(int(d.ready["rss_kb"]) for d in drivers if d.ready)
            with psycopg.connect(url, autocommit=True) as watch, psycopg.connect(url) as producer:
                # The check for unfinished jobs (UNFINISHED_SQL) must read the partial indexes: planned with the
                # statistics of the full backlog (ANALYZE above), `status = 'queued'` was a sequential scan of
                # the whole table, 10 ms of a core at every poll of a drain's last tenth (50,000 jobs), taken
                # from the drain it times; through the index, 1 ms once its dead entries are marked.
                watch.execute("SET enable_seqscan = off")
                if profile:
                    profiler = DrainProfiler(url, [d.process.pid for d in drivers], [watch.info.backend_pid])
                    profiler.start()
                started = time.perf_counter()
                for d in drivers:
                    d.send("go")
                if running_at_go:  # the jobs arrive at running, idle workers (woken by the commit's notification)
                    enqueue_many(producer, QUEUE, [None] * n,
                                 limit_keys=bench_limit_keys(0, n, flow.get("keys", 0), flow.get("key_run", 1)))
                    producer.commit()
                timed_out = False
                while True:
                    for d in drivers:
                        d.pump()
                    handled = sum(int(d.last_progress.get("handled", 0)) for d in drivers)
                    elapsed = time.perf_counter() - started
                    self.progress.update(f"{label}: {handled:,}/{n:,} handled, "
                                         f"{handled / max(elapsed, 1e-9):,.0f} jobs/s, {elapsed:.1f}s")
                    if any(d.result is not None for d in drivers):
                        raise BenchError(f"{label}: a worker exited early:\n"
                                         + "\n".join(d.log_tail() for d in drivers))
                    if elapsed > self.args.max_seconds:
                        timed_out = True
                        break
                    if handled >= 0.9 * n and not watch.execute(UNFINISHED_SQL[system]).fetchone()[0]:  # type: ignore[index]
                        break
                    time.sleep(DONE_POLL_S if handled >= 0.9 * n else 0.05)
                elapsed = time.perf_counter() - started
                profile_result = profiler.stop() if profiler else None
                if holder is not None:  # still open (idle_in_transaction_session_timeout would end it): else no figure
                    try:
                        holder.execute("SELECT 1")
                    except psycopg.Error as exc:
                        raise BenchError(f"{label}: the transaction held open ended during the drain ({exc})") from None
                if timed_out:
                    finished = self._finished_count(watch, system, n)
                else:
                    finished = n
            for d in drivers:
                d.send("stop")
            results = [d.wait_result(120) for d in drivers]
        finally:
            if holder is not None:
                holder.close()
            if profiler is not None:
                profiler._stop.set()
            for d in drivers:
                d.send("stop")
                d.close()
        out = {
            "label": label, "system": system, "n": n, "finished": finished, "seconds": elapsed,
            "jobs_per_s": finished / elapsed, "timed_out": timed_out, "processes": processes,
            "worker": worker or {}, "rss_start_kb": rss_start,
            "rss_end_kb": sum(int(r.get("rss_kb", 0)) for r in results),
            # (outboxq: the workers' counters summed: claimed, completed, failed, fenced, cancelled)
            "worker_stats": {k: sum(int(r.get("stats", {}).get(k, 0)) for r in results)
                             for k in sorted({k for r in results for k in r.get("stats", {})})},
            "rss_max_kb": sum(d.max_rss_kb for d in drivers),
            "fill_jobs_per_s": fill_result["jobs_per_s"] if fill_result else None,
        }
        if system == "outboxq":
            out["worker_defaults"] = {"concurrency": results[0].get("concurrency"),
                                      "batch_size": results[0].get("batch_size")}
            out["thread_cpu_s"] = results[0].get("thread_cpu_s")
            out["package"] = results[0].get("package")
            if "cprofile_top" in results[0]:
                out["cprofile_top"] = results[0]["cprofile_top"]
                out["cprofile_path"] = extra.get("profile_path")
        if profile_result is not None:
            out["profile"] = profile_result
        self.progress.done(f"{label}: {finished:,} jobs in {elapsed:.2f}s = {out['jobs_per_s']:,.0f} jobs/s"
                           + (" (time limit reached)" if timed_out else ""))
        return out

    @staticmethod
    def _finished_count(conn: psycopg.Connection, system: str, n: int) -> int:
        remaining_sql = {
            "outboxq": "SELECT count(*) FROM outboxq_jobs WHERE status <> 'done'",
            "pgqueuer": "SELECT count(*) FROM pgqueuer",
            "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
        }[system]
        return n - int(conn.execute(remaining_sql).fetchone()[0])  # type: ignore[index]

    # ------------------------------------------------------------ enqueue

    def enqueue_outboxq(self) -> dict[str, Any]:
        """enqueue + commit vs a bare INSERT + commit (alternating blocks), and enqueue_many batches."""
        from outboxq.queue.enqueue import enqueue

        args = self.args
        url = self.fresh_db("outboxq", "enqueue")
        calls, blocks = args.enqueue_calls, 4
        per_block = max(1, calls // blocks)
        kinds = ("enqueue", "insert", "insert_jobs")
        timings: dict[str, float] = {f"{k}_{m}": 0.0 for k in kinds for m in ("commit", "in_tx")}
        # insert_jobs: the same one-row INSERT into outboxq_jobs itself (its indexes and NOTIFY trigger,
        # none of enqueue()'s Python): splits enqueue's cost between the table and the function.
        insert_jobs = "INSERT INTO outboxq_jobs (queue, payload) VALUES (%s, %s) RETURNING id"
        with psycopg.connect(url) as conn:
            conn.execute("CREATE TABLE bench_bare (id bigserial PRIMARY KEY, queue text NOT NULL, "
                         "payload jsonb, created_at timestamptz NOT NULL DEFAULT now())")
            conn.commit()
            insert = "INSERT INTO bench_bare (queue, payload) VALUES (%s, %s) RETURNING id"
            def one(kind: str, i: int) -> None:
                if kind == "enqueue":
                    enqueue(conn, "bench", {"i": i})
                else:
                    conn.execute(insert if kind == "insert" else insert_jobs, ("bench", json.dumps({"i": i})))

            for _ in range(20):  # warm every path (prepared statements, caches)
                for kind in kinds:
                    one(kind, 0)
                conn.commit()
            for block in range(blocks):
                self.progress.update(f"enqueue outboxq: block {block + 1}/{blocks}", force=True)
                order = list(kinds) if block % 2 == 0 else list(reversed(kinds))
                for kind in order:
                    t0 = time.perf_counter()
                    for i in range(per_block):
                        one(kind, i)
                        conn.commit()
                    timings[f"{kind}_commit"] += time.perf_counter() - t0
                    t0 = time.perf_counter()  # the statement alone: many calls, one commit
                    for i in range(per_block):
                        one(kind, i)
                    conn.commit()
                    timings[f"{kind}_in_tx"] += time.perf_counter() - t0
            # Each call its own transaction on an autocommit connection (what a standalone enqueue gets, and how
            # the peers' single enqueue runs): the INSERT and its commit in one round trip instead of two.
            conn.autocommit = True
            t0 = time.perf_counter()
            for i in range(total_calls := per_block * blocks):
                enqueue(conn, "bench", {"i": i})
            timings["enqueue_autocommit"] = time.perf_counter() - t0
            conn.autocommit = False
            many_rates = []
            for _ in range(args.enqueue_many_batches):
                payloads = [{"i": i} for i in range(10_000)]
                t0 = time.perf_counter()
                enqueue_many(conn, "bench", payloads)
                conn.commit()
                many_rates.append(10_000 / (time.perf_counter() - t0))
            small_rates = []
            for _ in range(10):
                payloads = [{"i": i} for i in range(1000)]
                t0 = time.perf_counter()
                enqueue_many(conn, "bench", payloads)
                conn.commit()
                small_rates.append(1000 / (time.perf_counter() - t0))
        total = per_block * blocks
        out = {
            "calls": total,
            "enqueue_commit_per_s": total / timings["enqueue_commit"],
            "enqueue_autocommit_per_s": total_calls / timings["enqueue_autocommit"],
            "insert_commit_per_s": total / timings["insert_commit"],
            "enqueue_in_tx_per_s": total / timings["enqueue_in_tx"],
            "insert_in_tx_per_s": total / timings["insert_in_tx"],
            "insert_jobs_commit_per_s": total / timings["insert_jobs_commit"],
            "insert_jobs_in_tx_per_s": total / timings["insert_jobs_in_tx"],
            "enqueue_many_10k_per_s": median(many_rates),
            "enqueue_many_1k_per_s": median(small_rates),
        }
        out["enqueue_vs_insert"] = out["enqueue_commit_per_s"] / out["insert_commit_per_s"]
        out["enqueue_vs_insert_in_tx"] = out["enqueue_in_tx_per_s"] / out["insert_in_tx_per_s"]
        if args.http:
            try:
                http_figures = self.enqueue_http(url)
            except Exception as exc:  # the API is optional for this figure
                out["http_error"] = str(exc)
            else:
                out.update(http_figures)
                python_rate = out["python_batch_1k_interleaved_per_s"]
                for ratio_name, figure in (("http_vs_python_1k", "http_batch_1k_per_s"),
                                           ("http_minimal_vs_python_1k", "http_minimal_batch_1k_per_s"),
                                           ("http_httpx_vs_python_1k", "http_batch_1k_httpx_per_s"),
                                           ("http_minimal_httpx_vs_python_1k", "http_minimal_batch_1k_httpx_per_s")):
                    out[ratio_name] = ratio(out[figure], python_rate)
        self.progress.done(
            f"enqueue outboxq: {out['enqueue_commit_per_s']:,.0f}/s with a commit each vs bare INSERT "
            f"{out['insert_commit_per_s']:,.0f}/s ({out['enqueue_vs_insert']:.2f}x); in one transaction "
            f"{out['enqueue_in_tx_per_s']:,.0f}/s vs {out['insert_in_tx_per_s']:,.0f}/s; enqueue_many "
            f"10k batches {out['enqueue_many_10k_per_s']:,.0f} jobs/s"
            + (f"; HTTP batch {out['http_batch_1k_per_s']:,.0f} jobs/s" if "http_batch_1k_per_s" in out else ""))
        return out

    @contextmanager
    def api_server(self, url: str) -> Iterator[tuple[int, str]]:
        """A local `outboxq serve` on `url`'s database, once it answers /readyz: its port and an admin token (its
        output in the run's log directory; stopped on leaving)."""
        port, token = free_port(), "bench-token-long-enough"
        env = dict(os.environ, DATABASE_URL=url, OUTBOXQ_API_TOKENS=f"{token}:admin",
                   OUTBOXQ_PORT=str(port), OUTBOXQ_HOST="127.0.0.1")
        with open(self.log_dir / "http.log", "w") as log, \
                api_process([sys.executable, "-m", "outboxq.api.server"], env, f"http://127.0.0.1:{port}",
                            DRIVERS.parent.parent, stdout=log):
            yield port, token

    def enqueue_http(self, url: str, rounds: int = HTTP_ROUNDS) -> dict[str, Any]:
        """POST /v1/queues/bench/jobs/batch with 1,000-job batches against a local `outboxq serve`, `rounds`
        times alternated with the same enqueue_many, timed with the standard library's http.client (each
        request sent and its whole answer read, on a kept-alive connection: tools.bench_http) and, beside it,
        with httpx (whose own parsing of the answer is part of its figure)."""
        import logging

        import httpx

        logging.getLogger("httpx").setLevel(logging.WARNING)
        with self.api_server(url) as (port, token), \
                httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client, \
                closing(http.client.HTTPConnection("127.0.0.1", port, timeout=60)) as plain:
            body = {"jobs": [{"payload": {"i": i}} for i in range(1000)]}
            payloads = [job["payload"] for job in body["jobs"]]
            full, minimal = batch_headers(token), batch_headers(token, minimal=True)

            def post_httpx(headers: dict[str, str]) -> None:
                client.post(BENCH_BATCH_PATH, content=orjson.dumps(body), headers=headers).raise_for_status()

            for _ in range(3):
                post_batch(plain, body, full)
                post_httpx(full)
            # The same 1,000 jobs through enqueue_many, alternating with the requests (with the jobs in the answer,
            # and with their ids only: Prefer: return=minimal): all figures from the same moments, so the load of
            # the machine weighs on them alike.
            timed: dict[str, list[float]] = {}
            with psycopg.connect(url) as conn:
                def python_path() -> None:
                    enqueue_many(conn, QUEUE, payloads)
                    conn.commit()

                steps: dict[str, Callable[[], Any]] = {
                    "http_batch_1k_per_s": lambda: post_batch(plain, body, full),
                    "http_minimal_batch_1k_per_s": lambda: post_batch(plain, body, minimal),
                    "http_batch_1k_httpx_per_s": lambda: post_httpx(full),
                    "http_minimal_batch_1k_httpx_per_s": lambda: post_httpx(minimal),
                    "python_batch_1k_interleaved_per_s": python_path,
                }
                for _ in range(rounds):
                    for name, step in steps.items():
                        t0 = time.perf_counter()
                        step()
                        timed.setdefault(name, []).append(1000 / (time.perf_counter() - t0))
        return {name: median(rates) for name, rates in timed.items()}

    def enqueue_single_alternating(self) -> dict[str, Any]:
        """outboxq's enqueue (autocommit: one round trip) and PgQueuer's single enqueue, each call its own
        transaction, in alternating blocks from fresh driver processes: both figures from the same minutes. Run
        minutes apart, the two rates moved by up to a third between runs (a commit waits for the disk, and its
        time drifts); alternated, their ratio holds still."""
        systems = ("outboxq", "pgqueuer")
        urls = {system: self.fresh_db(system, "single") for system in systems}
        rates: dict[str, list[float]] = {system: [] for system in systems}
        per_block = max(1, self.args.peer_enqueue_calls // SINGLE_ENQUEUE_BLOCKS)
        for block in range(SINGLE_ENQUEUE_BLOCKS):
            self.progress.update(f"single enqueue, alternating: block {block + 1}/{SINGLE_ENQUEUE_BLOCKS}", force=True)
            for system in systems if block % 2 == 0 else reversed(systems):
                result = self.driver(system, "enqueue_single", urls[system], n=per_block,
                                     autocommit=True).wait_result(600)
                rates[system].append(result["jobs_per_s"])
        out = {f"{system}_per_s": median(rates[system]) for system in systems}
        out["outboxq_vs_pgqueuer"] = ratio(out["outboxq_per_s"], out["pgqueuer_per_s"])
        self.progress.done(f"single enqueue, alternating: outboxq {out['outboxq_per_s']:,.0f}/s, pgqueuer "
                           f"{out['pgqueuer_per_s']:,.0f}/s ({out['outboxq_vs_pgqueuer']:.2f}x; blocks "
                           f"{[round(x) for x in rates['outboxq']]} / {[round(x) for x in rates['pgqueuer']]})")
        return out

    def enqueue_peer(self, system: str) -> dict[str, Any]:
        """The peer's single-job enqueue (one transaction each) and its batch enqueue."""
        url = self.fresh_db(system, "enqueue")
        self.progress.update(f"enqueue {system}", force=True)
        single = self.driver(system, "enqueue_single", url, n=self.args.peer_enqueue_calls).wait_result(600)
        batch = self.driver(system, "fill", url, n=10_000 * self.args.enqueue_many_batches).wait_result(600)
        out = {"enqueue_commit_per_s": single["jobs_per_s"], "batch_10k_per_s": batch["jobs_per_s"]}
        self.progress.done(f"enqueue {system}: {out['enqueue_commit_per_s']:,.0f}/s single, "
                           f"{out['batch_10k_per_s']:,.0f} jobs/s in 10k batches")
        return out

    # ------------------------------------------------------------ latency

    def latency(self, system: str) -> dict[str, Any]:
        """Idle worker; one job at a time committed; commit returned → handler started."""
        url = self.fresh_db(system, "latency")
        worker = self.driver(system, "latency_worker", url)
        try:
            worker.wait_ready()
            self.progress.update(f"latency {system}: {self.args.latency_samples} samples", force=True)
            enqueuer = self.driver(system, "latency_enqueue", url, n=self.args.latency_samples,
                                   gap_s=self.args.latency_gap_ms / 1000)
            committed = enqueuer.wait_result(600)["committed"]
            time.sleep(0.5)  # let the last one start
            worker.send("stop")
            started = worker.wait_result(60)["started"]
        finally:
            worker.send("stop")
            worker.close()
        samples = [(started[seq] - committed[seq]) * 1000 for seq in committed if seq in started]
        if not samples:
            raise BenchError(f"latency {system}: no job started")
        out = {"samples": len(samples), "missing": len(committed) - len(samples),
               "p50_ms": percentile(samples, 50), "p90_ms": percentile(samples, 90),
               "p99_ms": percentile(samples, 99), "max_ms": max(samples)}
        self.progress.done(f"latency {system}: p50 {out['p50_ms']:.2f} ms, p99 {out['p99_ms']:.2f} ms "
                           f"({out['samples']} samples)")
        return out

    # ------------------------------------------------------------ pgbench ceiling

    def pgbench(self) -> dict[str, Any] | None:
        """SKIP LOCKED claim + completion in plain SQL: 1 and 100 jobs per transaction."""
        binary = shutil.which("pgbench")
        if binary is None:
            self.progress.done("pgbench: not installed, no ceiling measured")
            return None
        url = self.server.recreate(f"{self.prefix}_pgbench")
        script = self.log_dir / "claim_complete.sql"
        script.write_text(
            "WITH c AS (SELECT id FROM q WHERE status = 'queued' ORDER BY id LIMIT :batch FOR UPDATE SKIP LOCKED),\n"
            "u AS (UPDATE q SET status = 'running' FROM c WHERE q.id = c.id RETURNING q.id)\n"
            "SELECT coalesce(array_agg(id), '{}')::text AS ids FROM u \\gset\n"
            "UPDATE q SET status = 'done', finished_at = now() WHERE id = ANY(:ids::bigint[]);\n"
        )
        out: dict[str, Any] = {}
        for batch, clients, per_client in self.args.pgbench_configs:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("DROP TABLE IF EXISTS q")
                conn.execute("CREATE TABLE q (id bigserial PRIMARY KEY, status text NOT NULL DEFAULT 'queued', "
                             "payload jsonb, finished_at timestamptz)")
                conn.execute("INSERT INTO q (payload) SELECT 'null'::jsonb FROM generate_series(1, %s)",
                             (batch * clients * per_client + batch * clients,))
                conn.execute("CREATE INDEX q_claim ON q (id) WHERE status = 'queued'")
                conn.execute("VACUUM ANALYZE q")
            label = f"pgbench {batch}/tx x{clients}"
            self.progress.update(label, force=True)
            run = subprocess.run(
                [binary, "-n", "-M", "prepared", "-f", str(script), "-D", f"batch={batch}", "-c", str(clients),
                 "-j", str(min(clients, os.cpu_count() or 1)), "-t", str(per_client), url],
                capture_output=True, text=True, timeout=600,
            )
            match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", run.stdout)
            if run.returncode != 0 or not match:
                raise BenchError(f"pgbench failed: {run.stderr[-2000:]}")
            jobs_per_s = float(match.group(1)) * batch
            out[f"{batch}x{clients}"] = {"batch": batch, "clients": clients, "jobs_per_s": jobs_per_s}
            self.progress.done(f"{label}: {jobs_per_s:,.0f} jobs/s")
        self.server.drop(f"{self.prefix}_pgbench")
        return out

    # ------------------------------------------------------------ backlog

    def backlog(self) -> dict[str, Any]:
        """Drain at a large backlog (with RSS), and the claim plan + drain with many finished jobs kept.

        The drain beside the finished jobs and a baseline drain alternate BACKLOG_PAIRS times, and their medians
        make the ratio: one drain of each moved it from 0.70 to 1.29 between two runs on a noisy machine."""
        args = self.args
        out: dict[str, Any] = {}
        baselines = [self.drain("outboxq", args.jobs, f"drain outboxq {args.jobs:,} (baseline)")]
        if args.backlog_jobs:
            out["large"] = self.drain("outboxq", args.backlog_jobs, f"drain outboxq {args.backlog_jobs:,} backlog")
        if args.finished_jobs:
            url = self.fresh_db("outboxq", "finished")
            self.progress.update(f"backlog: writing {args.finished_jobs:,} finished jobs", force=True)
            t0 = time.perf_counter()
            with psycopg.connect(url, autocommit=True) as conn:
                step = 1_000_000
                for offset in range(0, args.finished_jobs, step):
                    conn.execute(
                        "INSERT INTO outboxq_jobs (queue, status, payload, attempts, max_attempts, started_at, "
                        "attempt_started_at, finished_at) SELECT 'bench', 'done', 'null'::jsonb, 1, 25, "
                        "now(), now(), now() FROM generate_series(1, %s)",
                        (min(step, args.finished_jobs - offset),))
                    self.progress.update(f"backlog: {offset + step:,} finished jobs written", force=True)
                conn.execute("VACUUM ANALYZE outboxq_jobs")
            self.progress.done(f"backlog: {args.finished_jobs:,} finished jobs written in "
                               f"{time.perf_counter() - t0:.0f}s")
            kept_runs = []
            for pair in range(BACKLOG_PAIRS):
                if pair:
                    baselines.append(self.drain("outboxq", args.jobs, f"drain outboxq {args.jobs:,} (baseline)"))
                self._enqueue_beside_history(url, args.jobs, checkpoint=pair == 0)
                if pair == 0:
                    out["claim_plan"] = claim_plan(url)
                    self.progress.done(
                        "claim plan with {:,} finished jobs: search {}, join {} ({:.2f} ms, {} buffers)".format(
                            args.finished_jobs, ", ".join(out["claim_plan"]["search_scans"]),
                            ", ".join(out["claim_plan"]["update_scans"]),
                            out["claim_plan"]["execution_ms"], out["claim_plan"]["buffers"]))
                kept_runs.append(self.drain("outboxq", args.jobs, f"drain outboxq {args.jobs:,} beside "
                                            f"{args.finished_jobs:,} finished", db_url=url, fill=False))
            out["with_finished"] = median_run(kept_runs)
            out["with_finished_runs"] = [round(r["jobs_per_s"]) for r in kept_runs]
        out["baseline"] = baseline = median_run(baselines)
        out["baseline_runs"] = [round(r["jobs_per_s"]) for r in baselines]
        if "large" in out:
            out["large_vs_baseline"] = out["large"]["jobs_per_s"] / baseline["jobs_per_s"]
        if "with_finished" in out:
            out["with_finished_vs_baseline"] = out["with_finished"]["jobs_per_s"] / baseline["jobs_per_s"]
        return out

    def _enqueue_beside_history(self, url: str, n: int, *, checkpoint: bool) -> None:
        """`n` no-op jobs into the database that keeps the finished jobs, then ANALYZE (and a CHECKPOINT)."""
        with psycopg.connect(url) as conn:
            for offset in range(0, n, 10_000):
                enqueue_many(conn, "bench", [None] * min(10_000, n - offset))
            conn.commit()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ANALYZE outboxq_jobs")
            if checkpoint:
                # Writing the history made about 1 GB of WAL: without a checkpoint here, the drain below runs
                # during the checkpoints it triggers (full-page writes for every page it touches first), which
                # is the cost of loading 5M rows a moment ago, not of keeping them (0.71 vs 0.9+ measured).
                conn.execute("CHECKPOINT")

    # ------------------------------------------------------------ orchestration

    def run(self) -> dict[str, Any]:
        """Every requested sub-benchmark, `rounds` times, the systems alternating within each round."""
        args = self.args
        wanted = args.which or ["drain", "enqueue", "latency"]
        steps: list[tuple[str, str, Callable[[], Any]]] = []
        # `outboxq worker`'s defaults: --processes auto, one worker process per core (at most 4).
        auto = default_count()
        if "drain" in wanted:
            # Each outboxq drain, then the same drain of every --variant (DRAIN@NAME), side by side in each round.
            variants = self.variants()
            outboxq_drains: list[tuple[str, Callable[[Variant | None], Any]]] = [
                ("outboxq", lambda v: self.drain("outboxq", args.jobs, f"drain outboxq defaults ({auto} processes)",
                                                 processes=auto, variant=v))]
            for processes in args.outboxq_processes:  # `outboxq worker --processes N`: N workers, one per process
                outboxq_drains.append((f"outboxq_p{processes}", lambda v, p=processes: self.drain(
                    "outboxq", args.jobs, f"drain outboxq --processes {p}", processes=p, variant=v)))
            if args.limits:  # flow control (issue 14): what a limit costs when it does not bind, and when it does
                for name, label, n, flow in flow_drains(args.jobs):
                    if args.flows and name.removeprefix("outboxq_") not in args.flows:
                        continue
                    outboxq_drains.append((name, lambda v, n=n, label=label, flow=flow: self.drain(
                        "outboxq", n, label, flow=flow, processes=auto, variant=v)))
            for name, run_drain in outboxq_drains:
                steps.append(("drain", name, lambda run_drain=run_drain: run_drain(None)))
                for variant in variants:
                    steps.append(("drain", f"{name}@{variant.name}",
                                  lambda run_drain=run_drain, v=variant: run_drain(v)))
            if args.compare:
                steps.append(("drain", "pgqueuer_defaults", lambda: self.drain(
                    "pgqueuer", args.jobs, "drain pgqueuer defaults (batch 10, 1 process)")))
                for batch, processes in args.pgqueuer_sweep:
                    steps.append(("drain", f"pgqueuer_b{batch}_p{processes}", lambda b=batch, p=processes: self.drain(
                        "pgqueuer", args.jobs, f"drain pgqueuer batch {b} x{p} processes",
                        worker={"batch_size": b}, processes=p)))
                steps.append(("drain", "procrastinate_defaults", lambda: self.drain(
                    "procrastinate", args.peer_slow_jobs, "drain procrastinate defaults (concurrency 1)")))
                steps.append(("drain", "procrastinate_c10_p4", lambda: self.drain(
                    "procrastinate", args.peer_slow_jobs, "drain procrastinate concurrency 10 x4 processes",
                    worker={"concurrency": 10}, processes=4)))
                steps.append(("drain", "pgbench", self.pgbench))
        if "enqueue" in wanted:
            steps.append(("enqueue", "outboxq", self.enqueue_outboxq))
            if args.compare:
                steps.append(("enqueue", "single_alternating", self.enqueue_single_alternating))
                steps.append(("enqueue", "pgqueuer", lambda: self.enqueue_peer("pgqueuer")))
                steps.append(("enqueue", "procrastinate", lambda: self.enqueue_peer("procrastinate")))
        if "manyqueues" in wanted:  # the claims are per queue: what fifty queues cost against one
            steps.append(("manyqueues", "one_queue", lambda: self.drain(
                "outboxq", args.jobs, f"drain outboxq, 1 queue x {args.jobs:,}", processes=auto)))
            steps.append(("manyqueues", "many_queues", lambda: self.drain(
                "outboxq", args.jobs, f"drain outboxq, {MANY_QUEUES} queues x {args.jobs // MANY_QUEUES:,}",
                processes=auto, queues=MANY_QUEUES)))
        if "deadrows" in wanted:  # a transaction left open holds back vacuum: what the dead rows cost a drain
            steps.append(("deadrows", "free", lambda: self.drain(
                "outboxq", args.dead_rows_jobs, f"drain outboxq {args.dead_rows_jobs:,}", processes=auto)))
            steps.append(("deadrows", "snapshot_held", lambda: self.drain(
                "outboxq", args.dead_rows_jobs, f"drain outboxq {args.dead_rows_jobs:,}, a transaction open "
                "throughout", processes=auto, hold_snapshot=True)))
        if "latency" in wanted:
            steps.append(("latency", "outboxq", lambda: self.latency("outboxq")))
            if args.compare:
                steps.append(("latency", "pgqueuer", lambda: self.latency("pgqueuer")))
                steps.append(("latency", "procrastinate", lambda: self.latency("procrastinate")))

        started = time.monotonic()
        collected: dict[str, dict[str, list[Any]]] = {}
        for round_number in range(1, args.rounds + 1):
            self.progress.prefix = f"[round {round_number}/{args.rounds}] " if args.rounds > 1 else ""
            # Alternate: odd rounds in order, even rounds reversed (per sub-benchmark group).
            ordered = steps if round_number % 2 else list(reversed(steps))
            for group, name, step in ordered:
                try:
                    result = step()
                except BenchError as exc:
                    self.progress.done(f"{group} {name}: FAILED: {exc}")
                    result = {"error": str(exc)}
                collected.setdefault(group, {}).setdefault(name, []).append(result)
        self.progress.prefix = ""
        if args.profile:
            # Not part of the figures above: one drain sampled from outside (server activity, CPU split),
            # one with cProfile in every worker thread (which slows the worker down).
            self.results["profile"] = {
                "sampled": self._guarded("profile sampled", lambda: self.drain(
                    "outboxq", args.jobs, "drain outboxq defaults, sampled", profile="sample")),
                "cprofile": self._guarded("profile cprofile", lambda: self.drain(
                    "outboxq", args.jobs, "drain outboxq defaults under cProfile", profile="cprofile")),
            }
        if "backlog" in wanted:
            self.results["backlog"] = self.backlog()
        if "features" in wanted:  # workflows, sequences, Spark streaming, dashboards: tools/bench_features.py
            self.progress.done("features: workflows and sequences, Spark streaming, ten dashboards (minutes)")
            self.results["features"] = run_features(args.url, finished_steps=args.finished_steps)
        self.results["runs"] = collected
        self.results["summary"] = summarize(collected)
        self.results["seconds"] = time.monotonic() - started
        return self.results


    def _guarded(self, name: str, step: Callable[[], Any]) -> Any:
        try:
            return step()
        except BenchError as exc:
            self.progress.done(f"{name}: FAILED: {exc}")
            return {"error": str(exc)}


def claim_plan(url: str, limit: int = 500) -> dict[str, Any]:
    """EXPLAIN ANALYZE of the worker's claim statement (rolled back): which index it uses, and its cost."""
    import uuid

    from outboxq.queue import sql
    from outboxq.workers.claim_cursor import FROM_THE_FRONT

    with psycopg.ClientCursor(psycopg.connect(url)) as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.job_claim_batch, {
            "queue": "bench", "limit": limit, "lease_token": uuid.uuid4(), "lease_s": 60.0,
            "worker_id": "bench", "default_max_attempts": 25, **FROM_THE_FRONT,
        })
        plan = cur.fetchone()[0][0]  # type: ignore[index]
        cur.connection.rollback()
        cur.connection.close()
    # Each scan of outboxq_jobs, tagged with the part of the statement it serves: the candidate search
    # (CTE fresh / retry and their sub-plans) or the UPDATE's join back to the claimed rows (by id).
    # A sequential scan in the join is the planner's right choice on a small table; what must never
    # happen is a sequential scan in the search, which would read every finished job kept for retention.
    nodes: list[tuple[str, dict[str, Any]]] = []

    def walk(node: dict[str, Any], part: str) -> None:
        name = node.get("Subplan Name", "")
        if name.startswith("CTE fresh") or name.startswith("CTE retry"):
            part = "search"
        nodes.append((part, node))
        for child in node.get("Plans", []):
            walk(child, part)

    walk(plan["Plan"], "update")
    jobs_scans = [(part, n) for part, n in nodes
                  if n.get("Relation Name") == "outboxq_jobs" and "Scan" in n["Node Type"]]
    search = [n for part, n in jobs_scans if part == "search"]
    update = [n for part, n in jobs_scans if part == "update"]

    def label(n: dict[str, Any]) -> str:
        return f"{n['Node Type']} {n.get('Index Name', '')}".strip()

    return {
        # (a Bitmap Index Scan names the index but not the table: look at every node of the search)
        "uses_claim_index": any(n.get("Index Name") == "outboxq_jobs_claim_idx"
                                for part, n in nodes if part == "search"),
        "search_seq_scan": any(n["Node Type"] == "Seq Scan" for n in search),
        "seq_scan_on_jobs": any(n["Node Type"] == "Seq Scan" for _, n in jobs_scans),
        "scans": sorted({label(n) for _, n in jobs_scans}),
        "search_scans": sorted({label(n) for n in search}),
        "update_scans": sorted({label(n) for n in update}),
        "execution_ms": plan.get("Execution Time"),
        "buffers": plan["Plan"].get("Shared Hit Blocks", 0) + plan["Plan"].get("Shared Read Blocks", 0),
    }


def summarize(collected: dict[str, dict[str, list[Any]]]) -> dict[str, Any]:
    """Medians over the rounds, and the ratios the goals are stated in."""
    summary: dict[str, Any] = {}
    drain = collected.get("drain", {})
    rates: dict[str, float | None] = {}
    for name, runs in drain.items():
        if name == "pgbench":
            configs: dict[str, list[float]] = {}
            for run in runs:
                for key, value in (run or {}).items():
                    if isinstance(value, dict) and "jobs_per_s" in value:
                        configs.setdefault(key, []).append(value["jobs_per_s"])
            summary["pgbench_jobs_per_s"] = {k: median(v) for k, v in configs.items()}
            continue
        good = [r["jobs_per_s"] for r in runs if r and "jobs_per_s" in r]
        rates[name] = median(good)
        summary.setdefault("drain_jobs_per_s", {})[name] = {
            # (a binding limit's drain runs at tens of jobs a second: a decimal there)
            "median": rates[name], "runs": [round(x) if x >= 1000 else round(x, 1) for x in good],
            "rss_start_kb": median([r["rss_start_kb"] for r in runs if r and "rss_start_kb" in r]),
            "rss_end_kb": median([r["rss_end_kb"] for r in runs if r and "rss_end_kb" in r]),
        }
    pgqueuer = {k: v for k, v in rates.items() if k.startswith("pgqueuer_b") and v}
    if pgqueuer:
        best = max(pgqueuer, key=lambda k: pgqueuer[k] or 0)
        summary["pgqueuer_best"] = {"config": best, "jobs_per_s": pgqueuer[best]}
    ours = rates.get("outboxq")
    summary["ratios"] = {
        "outboxq_vs_pgqueuer_best": ratio(ours, summary.get("pgqueuer_best", {}).get("jobs_per_s")),
        "outboxq_vs_pgqueuer_defaults": ratio(ours, rates.get("pgqueuer_defaults")),
        "outboxq_vs_procrastinate_defaults": ratio(ours, rates.get("procrastinate_defaults")),
        "outboxq_vs_procrastinate_best": ratio(ours, rates.get("procrastinate_c10_p4")),
    }
    # How steady the default drain is, and whether it is ahead in every round (issue 40): its slowest round against
    # its median, and against the fastest round of PgQueuer's best configuration.
    ours_runs = summary.get("drain_jobs_per_s", {}).get("outboxq", {}).get("runs")
    if ours_runs and ours:
        summary["ratios"]["outboxq_slowest_round_of_median"] = ratio(min(ours_runs), ours)
        best_runs = summary["drain_jobs_per_s"].get(summary.get("pgqueuer_best", {}).get("config"), {}).get("runs")
        if best_runs:
            summary["ratios"]["outboxq_slowest_vs_pgqueuer_best_fastest"] = ratio(min(ours_runs), max(best_runs))
    for name, rate in rates.items():  # outboxq --processes N against the same peers
        if re.fullmatch(r"outboxq_p[0-9]+", name):
            summary["ratios"][f"{name}_vs_pgqueuer_best"] = ratio(
                rate, summary.get("pgqueuer_best", {}).get("jobs_per_s"))
    # Flow control (issue 14): a limit that does not bind against the defaults of the same run; a binding
    # concurrency limit against the rate it allows (its slots over the handlers' sleep).
    for name, _label, _n, flow in flow_drains(0):
        if rates.get(name) is None:
            continue
        if "sleep" in flow:
            allowed = flow["consumer"]["global_concurrency"] / flow["sleep"]
            summary["ratios"][f"{name}_of_the_{allowed:.0f}_allowed"] = ratio(rates[name], allowed)
        elif "rate_limit" not in flow["consumer"]:
            summary["ratios"][f"{name}_vs_defaults"] = ratio(rates[name], ours)
            summary["ratios"][f"{name}_vs_defaults_per_round"] = paired_ratio(drain[name], drain.get("outboxq", []))
    # --variant: each drain of this checkout against the same drain of the variant, and the variant's own flow
    # ratios against its own defaults.
    for name in [n for n in rates if "@" in n]:
        base, variant = name.split("@", 1)
        summary["ratios"][f"{base}_vs_{name}"] = ratio(rates.get(base), rates[name])
        summary["ratios"][f"{base}_vs_{name}_per_round"] = paired_ratio(drain.get(base, []), drain[name])
        if any(base == flow_name and "sleep" not in flow and "rate_limit" not in flow["consumer"]
               for flow_name, _label, _n, flow in flow_drains(0)):  # (the limits that do not bind)
            summary["ratios"][f"{name}_vs_defaults@{variant}"] = ratio(rates[name], rates.get(f"outboxq@{variant}"))
            # (Round by round too: on a drifting machine the medians' ratio can differ from it by a tenth.)
            summary["ratios"][f"{name}_vs_defaults@{variant}_per_round"] = paired_ratio(
                drain[name], drain.get(f"outboxq@{variant}", []))
    ceilings = summary.get("pgbench_jobs_per_s") or {}
    if ceilings and ours:
        summary["ratios"]["outboxq_vs_pgbench_batched_best"] = ratio(ours, max(ceilings.values()))
    for group, (test, base) in {"manyqueues": ("many_queues", "one_queue"),
                                "deadrows": ("snapshot_held", "free")}.items():
        rates = {name: [r["jobs_per_s"] for r in runs if r and "jobs_per_s" in r]
                 for name, runs in collected.get(group, {}).items()}
        if rates:
            summary[group] = {name: {"median": median(v), "runs": [round(x) for x in v]} for name, v in rates.items()}
            summary["ratios"][f"{group}_{test}_vs_{base}"] = ratio(summary[group].get(test, {}).get("median"),
                                                                   summary[group].get(base, {}).get("median"))
    for group in ("enqueue", "latency"):
        for name, runs in collected.get(group, {}).items():
            keys = {k for r in runs if r and "error" not in r for k, v in r.items() if isinstance(v, int | float)}
            summary.setdefault(group, {})[name] = {
                k: median([r[k] for r in runs if r and isinstance(r.get(k), int | float)]) for k in sorted(keys)
            }
    ratios = summary["ratios"]
    enqueue = summary.get("enqueue", {})
    if enqueue.get("outboxq"):
        ratios["enqueue_vs_bare_insert"] = enqueue["outboxq"].get("enqueue_vs_insert")
        http_errors = [r["http_error"] for r in collected["enqueue"]["outboxq"] if r and r.get("http_error")]
        if http_errors:  # (the rounds' HTTP figures failed: the table says why, beside its "-")
            enqueue["outboxq"]["http_error"] = http_errors[-1]
        for peer in ("pgqueuer", "procrastinate"):
            ratios[f"enqueue_vs_{peer}"] = ratio(enqueue["outboxq"].get("enqueue_commit_per_s"),
                                                  enqueue.get(peer, {}).get("enqueue_commit_per_s"))
            ratios[f"enqueue_autocommit_vs_{peer}"] = ratio(enqueue["outboxq"].get("enqueue_autocommit_per_s"),
                                                             enqueue.get(peer, {}).get("enqueue_commit_per_s"))
            ratios[f"enqueue_many_vs_{peer}"] = ratio(enqueue["outboxq"].get("enqueue_many_10k_per_s"),
                                                       enqueue.get(peer, {}).get("batch_10k_per_s"))
    if enqueue.get("single_alternating"):
        ratios["enqueue_single_alternating_vs_pgqueuer"] = enqueue["single_alternating"].get("outboxq_vs_pgqueuer")
    latency = summary.get("latency", {})
    for peer in ("pgqueuer", "procrastinate"):
        if latency.get("outboxq") and latency.get(peer):
            ratios[f"latency_p50_{peer}_over_outboxq"] = ratio(latency[peer]["p50_ms"], latency["outboxq"]["p50_ms"])
            ratios[f"latency_p99_{peer}_over_outboxq"] = ratio(latency[peer]["p99_ms"], latency["outboxq"]["p99_ms"])
    return summary


# ---------------------------------------------------------------- report


def _num(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _drain_rounds(results: dict[str, Any]) -> list[str]:
    """outboxq's default drain round by round, beside PgQueuer's best in the same round, with what the worker did:
    its claim statements and writes (the same work each round: more of them would be a slower way of draining)
    and the CPU its threads spent on it (more for the same statements: a slower machine in that round)."""
    runs = (results.get("runs") or {}).get("drain") or {}
    ours = runs.get("outboxq") or []
    if len(ours) < 2:
        return []
    best = ((results.get("summary") or {}).get("pgqueuer_best") or {}).get("config")
    theirs = runs.get(best) or []  # (best is None without a PgQueuer run: no such key)
    lines = [f"| round | outboxq jobs/s | {best or 'PgQueuer'} jobs/s | ratio | claim statements | writes | "
             "worker threads' CPU s | fill jobs/s |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for index, run in enumerate(ours):
        peer = theirs[index]["jobs_per_s"] if index < len(theirs) else None
        stats = run.get("worker_stats") or {}
        lines.append(f"| {index + 1} | {_num(run['jobs_per_s'])} | {_num(peer)} | {_num(ratio(run['jobs_per_s'], peer), 2)} | "
                     f"{_num(stats.get('claims'))} | {_num(stats.get('writes'))} | "
                     f"{_num(sum((run.get('thread_cpu_s') or {}).values()), 2)} | {_num(run.get('fill_jobs_per_s'))} |")
    return [*lines, ""]


def render(results: dict[str, Any]) -> str:
    """The human-readable tables (Markdown)."""
    s = results.get("summary", {})
    m, srv = results["machine"], results["server"]
    lines = [
        f"machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gb']} GB, load {m['load_1m']}, "
        f"Python {m['python']}; PostgreSQL {srv['version']}, synchronous_commit={srv['synchronous_commit']}, "
        f"fsync={srv['fsync']}, shared_buffers={srv['shared_buffers']}",
    ]
    if results.get("runs"):  # (not when only backlog or features ran: they print their own sizes)
        lines.append(f"rounds: {results['settings']['rounds']} (medians), drain of {results['settings']['jobs']:,} "
                     f"no-op jobs (Procrastinate: {results['settings']['peer_slow_jobs']:,})")
    lines.append("")
    drain = s.get("drain_jobs_per_s", {})
    if drain:
        ours = (drain.get("outboxq") or {}).get("median")
        lines += ["| drain | jobs/s (median) | runs | outboxq / this | worker RSS start → end |",
                  "| --- | ---: | --- | ---: | --- |"]
        for name, d in drain.items():
            lines.append(f"| {name} | {_num(d['median'], 0 if (d['median'] or 0) >= 1000 else 1)} | "
                         f"{', '.join(f'{x:,}' for x in d['runs'])} | "
                         f"{_num(ratio(ours, d['median']), 2)} | "
                         f"{_num((d['rss_start_kb'] or 0) / 1024, 1)} → {_num((d['rss_end_kb'] or 0) / 1024, 1)} MB |")
        for key, value in (s.get("pgbench_jobs_per_s") or {}).items():
            batch, clients = key.split("x")
            lines.append(f"| pgbench ceiling, {batch} job(s)/tx, {clients} client(s) | {_num(value)} | | "
                         f"{_num(ratio(ours, value), 2)} | |")
        if s.get("pgqueuer_best"):
            lines.append(f"\nPgQueuer best configuration: {s['pgqueuer_best']['config']}")
        lines.append("")
        lines += _drain_rounds(results)
    enqueue = s.get("enqueue", {})
    if enqueue.get("outboxq"):
        e = enqueue["outboxq"]
        lines += ["| enqueue | per second |", "| --- | ---: |",
                  f"| outboxq enqueue + commit, one job per call | {_num(e.get('enqueue_commit_per_s'))} |",
                  f"| outboxq enqueue on an autocommit connection (each call its own transaction) | "
                  f"{_num(e.get('enqueue_autocommit_per_s'))} |",
                  f"| bare one-row INSERT + commit, same connection | {_num(e.get('insert_commit_per_s'))} |",
                  f"| ratio enqueue / bare INSERT (commit each) | {_num(e.get('enqueue_vs_insert'), 2)} |",
                  f"| outboxq enqueue, many per transaction | {_num(e.get('enqueue_in_tx_per_s'))} |",
                  f"| bare INSERT, many per transaction | {_num(e.get('insert_in_tx_per_s'))} |",
                  f"| ratio (statement cost alone) | {_num(e.get('enqueue_vs_insert_in_tx'), 2)} |",
                  f"| one-row INSERT into outboxq_jobs itself + commit (no enqueue()) | "
                  f"{_num(e.get('insert_jobs_commit_per_s'))} |",
                  f"| the same, many per transaction | {_num(e.get('insert_jobs_in_tx_per_s'))} |",
                  f"| outboxq enqueue_many, 10,000-job batches (jobs/s) | {_num(e.get('enqueue_many_10k_per_s'))} |",
                  f"| outboxq enqueue_many, 1,000-job batches (jobs/s) | {_num(e.get('enqueue_many_1k_per_s'))} |",
                  f"| HTTP batch route, 1,000-job batches (jobs/s) | {_num(e.get('http_batch_1k_per_s'))} |",
                  f"| enqueue_many, 1,000-job batches, alternating with those requests (jobs/s) | "
                  f"{_num(e.get('python_batch_1k_interleaved_per_s'))} |",
                  f"| ratio HTTP / Python (1,000-job batches, alternating) | {_num(e.get('http_vs_python_1k'), 2)} |",
                  f"| HTTP batch route with Prefer: return=minimal (answer: the ids) (jobs/s) | "
                  f"{_num(e.get('http_minimal_batch_1k_per_s'))} |",
                  f"| ratio HTTP return=minimal / Python | {_num(e.get('http_minimal_vs_python_1k'), 2)} |",
                  f"| the same two requests timed with httpx as the client: ratio HTTP / Python, return=minimal "
                  f"| {_num(e.get('http_httpx_vs_python_1k'), 2)}, {_num(e.get('http_minimal_httpx_vs_python_1k'), 2)} |"]
        if e.get("http_error"):  # (the HTTP figures above are then "-": say why)
            lines.append(f"| HTTP batch route failed | {e['http_error'][:200].replace('|', '/')} |")
        for peer in ("pgqueuer", "procrastinate"):
            if enqueue.get(peer):
                lines.append(f"| {peer} single enqueue (one transaction each) | "
                             f"{_num(enqueue[peer].get('enqueue_commit_per_s'))} |")
                lines.append(f"| {peer} batch enqueue, 10,000-job batches (jobs/s) | "
                             f"{_num(enqueue[peer].get('batch_10k_per_s'))} |")
        if enqueue.get("single_alternating"):
            a = enqueue["single_alternating"]
            lines += [f"| single enqueue, alternating blocks: outboxq (autocommit) | {_num(a.get('outboxq_per_s'))} |",
                      f"| single enqueue, alternating blocks: pgqueuer | {_num(a.get('pgqueuer_per_s'))} |",
                      f"| ratio outboxq / pgqueuer (alternating blocks) | {_num(a.get('outboxq_vs_pgqueuer'), 2)} |"]
        lines.append("")
    latency = s.get("latency", {})
    if latency:
        lines += ["| latency: commit → handler start (idle worker) | p50 ms | p90 ms | p99 ms | max ms |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for name, lat in latency.items():
            lines.append(f"| {name} | {_num(lat.get('p50_ms'), 2)} | {_num(lat.get('p90_ms'), 2)} | "
                         f"{_num(lat.get('p99_ms'), 2)} | {_num(lat.get('max_ms'), 2)} |")
        lines.append("")
    titles = {"manyqueues": f"many queues: the same jobs in 1 queue, and in {MANY_QUEUES} (a consumer each)",
              "deadrows": "dead rows: the same drain, and with a transaction open throughout"}
    for group, title in titles.items():
        if s.get(group):
            lines += [f"| {title} | jobs/s (median) | runs |", "| --- | ---: | --- |"]
            lines += [f"| {name} | {_num(d['median'])} | {', '.join(f'{x:,}' for x in d['runs'])} |"
                      for name, d in s[group].items()]
            lines.append("")
    backlog = results.get("backlog")
    if backlog:
        lines += ["| backlog | value |", "| --- | ---: |",
                  f"| drain {backlog['baseline']['n']:,} (baseline, median of {backlog['baseline_runs']}), jobs/s "
                  f"| {_num(backlog['baseline']['jobs_per_s'])} |"]
        if "large" in backlog:
            big = backlog["large"]
            lines += [f"| drain {big['n']:,} backlog, jobs/s | {_num(big['jobs_per_s'])} |",
                      f"| ratio large / baseline | {_num(backlog['large_vs_baseline'], 2)} |",
                      f"| worker RSS at start / max / end ({big['n']:,} drain) | {_num(big['rss_start_kb'] / 1024, 1)} / "
                      f"{_num(big['rss_max_kb'] / 1024, 1)} / {_num(big['rss_end_kb'] / 1024, 1)} MB |"]
        if "claim_plan" in backlog:
            plan = backlog["claim_plan"]
            kept = backlog["with_finished"]
            lines += [f"| claim plan beside finished jobs | search: {', '.join(plan['search_scans'])}; "
                      f"join: {', '.join(plan['update_scans'])} "
                      f"({_num(plan['execution_ms'], 2)} ms, {plan['buffers']} buffers) |",
                      f"| drain {kept['n']:,} beside {results['settings']['finished_jobs']:,} finished (median of "
                      f"{backlog['with_finished_runs']}), jobs/s | {_num(kept['jobs_per_s'])} |",
                      f"| ratio with finished / baseline | {_num(backlog['with_finished_vs_baseline'], 2)} |"]
        lines.append("")
    lines += render_profile(results.get("profile"))
    lines += render_features(results.get("features"))
    ratios = {k: v for k, v in (s.get("ratios") or {}).items() if v is not None}
    if ratios:
        lines += ["| ratio | value |", "| --- | ---: |"] + [f"| {k} | {v:.2f} |" for k, v in ratios.items()]
    return "\n".join(lines)


def render_profile(profile: dict[str, Any] | None) -> list[str]:
    """The profile section: CPU split, server-side activity per connection, busiest threads, cProfile top."""
    if not profile:
        return []
    lines: list[str] = []
    sampled = profile.get("sampled") or {}
    if "profile" in sampled:
        prof = sampled["profile"]
        cpu = prof["cpu_s"]
        lines += [f"profile (sampled drain: {sampled['n']:,} jobs in {sampled['seconds']:.2f}s = "
                  f"{sampled['jobs_per_s']:,.0f} jobs/s; pg_stat_activity every {prof['sample_interval_s'] * 1000:.0f} ms, "
                  f"{prof['samples']} samples)", "",
                  "| CPU during the drain | seconds | share of machine capacity |", "| --- | ---: | ---: |"]
        for key in ("worker_process", "postgres_backends", "other", "machine_busy", "machine_capacity"):
            lines.append(f"| {key} | {cpu[key]:.2f} | {100 * cpu[key] / max(cpu['machine_capacity'], 1e-9):.0f}% |")
        lines += ["", "| worker connection | server-side state | share of samples |", "| --- | --- | ---: |"]
        for role, states in prof["connections"].items():
            for what, share in states.items():
                lines.append(f"| {role} | {what} | {100 * share:.0f}% |")
        if sampled.get("thread_cpu_s"):
            lines += ["", "| worker thread | CPU s |", "| --- | ---: |"]
            lines += [f"| {name} | {cpu_s:.2f} |" for name, cpu_s in sampled["thread_cpu_s"].items()]
        lines.append("")
    profiled = profile.get("cprofile") or {}
    if profiled.get("cprofile_top"):
        lines += [f"cProfile of every worker thread, in thread CPU seconds (drain of {profiled['n']:,} jobs at "
                  f"{profiled['jobs_per_s']:,.0f} jobs/s under the profiler; {profiled.get('cprofile_path')}):", "",
                  "| function | calls | tottime s | cumtime s |", "| --- | ---: | ---: | ---: |"]
        lines += [f"| {r['function']} | {r['calls']:,} | {r['tottime_s']:.3f} | {r['cumtime_s']:.3f} |"
                  for r in profiled["cprofile_top"][:20]]
        lines.append("")
    return lines


# ---------------------------------------------------------------- peers' virtual environment


def ensure_peers_venv(venv: Path, progress: Progress) -> str:
    """The Python of a virtual environment holding PgQueuer and Procrastinate (created when missing)."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import pgqueuer, procrastinate, asyncpg"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return str(python)
    progress.done(f"creating the peers' virtual environment in {venv} (pip install {' '.join(PEER_PACKAGES)})")
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PEER_PACKAGES],
                             capture_output=True, text=True)
    if install.returncode != 0 or subprocess.run(check, capture_output=True).returncode != 0:
        raise BenchError(f"could not install the peers into {venv}:\n{install.stderr[-2000:]}")
    return str(python)


def peer_versions(python: str) -> dict[str, str]:
    """Installed versions of the peers."""
    code = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
            "('pgqueuer', 'procrastinate', 'asyncpg', 'psycopg')}))")
    run = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return json.loads(run.stdout) if run.returncode == 0 else {}


# ---------------------------------------------------------------- CLI


def _pair_list(text: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in item.split("x")) for item in text.split(",") if item]  # type: ignore[misc]


# The names --flows takes: flow_drains' names without their "outboxq_".
FLOW_NAMES = [name.removeprefix("outboxq_") for name, *_ in flow_drains(0)]


def _flow_names(text: str) -> list[str]:
    names = [x for x in text.split(",") if x]
    unknown = [x for x in names if x not in FLOW_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown flow-control drain {', '.join(unknown) or repr(text)}; choose "
                                         f"from {', '.join(FLOW_NAMES)}")
    return names


def _triple_list(text: str) -> list[tuple[int, int, int]]:
    return [tuple(int(x) for x in item.split("x")) for item in text.split(",") if item]  # type: ignore[misc]


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmarks, print the tables (or --json), drop the benchmark databases."""
    unknown = [w for w in args.which if w not in SUB_BENCHMARKS]
    if unknown:
        print(f"bench: unknown sub-benchmark {', '.join(unknown)}; choose from "
              f"{', '.join(SUB_BENCHMARKS)}", file=sys.stderr)
        return 2
    if args.url is None:
        from outboxq.db import database_url

        args.url = database_url()
    bench = Bench(args)
    try:
        try:
            bench.variants()  # (exported before the first round: a revision git does not know is refused at once)
        except BenchError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 2
        results = bench.run()
        if args.compare and bench.peers_python:
            results["peer_versions"] = peer_versions(bench.peers_python)
    finally:
        if not args.keep:
            bench.cleanup()
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2, default=str))
    if args.json:
        print(json.dumps(results, indent=2, default=str))
    else:
        print(render(results))
    failed = [name for group in results["runs"].values() for name, runs in group.items()
              if any(r and "error" in r for r in runs)]
    failed += [name for name, result in (results.get("features") or {}).items() if "error" in result]
    return 1 if failed else 0


def register(sub: Any) -> None:
    """Add `python -m tools bench` to the CLI."""
    p = sub.add_parser("bench", help="benchmarks: drain, enqueue, latency, backlog (--compare: peers too)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("which", nargs="*", metavar="SUB",
                   help=f"sub-benchmarks among {', '.join(SUB_BENCHMARKS)} (default: drain enqueue latency)")
    p.add_argument("--compare", action="store_true", help="also run PgQueuer, Procrastinate and pgbench")
    p.add_argument("--rounds", type=int, default=1, help="alternated rounds; figures are medians (default 1)")
    p.add_argument("--jobs", type=int, default=50_000, help="jobs per drain (default 50,000)")
    p.add_argument("--peer-slow-jobs", type=int, default=5_000,
                   help="jobs per Procrastinate drain, which runs at a few hundred jobs/s (default 5,000)")
    p.add_argument("--pgqueuer-sweep", type=_pair_list, default=_pair_list("100x1,500x1,500x2,1000x2"),
                   help="PgQueuer batch sizes x processes to sweep (default 100x1,500x1,500x2,1000x2)")
    p.add_argument("--outboxq-processes", type=lambda text: [int(x) for x in text.split(",") if x], default=[1],
                   help="also drain with outboxq worker --processes N for each N (default 1: the worker in one "
                        "process, beside the defaults' one per core; '' for none)")
    p.add_argument("--pgbench-configs", type=_triple_list, default=_triple_list("1x1x2000,1x8x400,100x1x200,100x4x100"),
                   help="pgbench jobs-per-transaction x clients x transactions-per-client "
                        "(default 1x1x2000,1x8x400,100x1x200,100x4x100)")
    p.add_argument("--enqueue-calls", type=int, default=2_000, help="single enqueues per method (default 2,000)")
    p.add_argument("--peer-enqueue-calls", type=int, default=1_000, help="single enqueues per peer (default 1,000)")
    p.add_argument("--enqueue-many-batches", type=int, default=5, help="10,000-job batches (default 5)")
    p.add_argument("--no-http", dest="http", action="store_false", help="skip the HTTP batch figure")
    p.add_argument("--latency-samples", type=int, default=1000,
                   help="latency samples (default 1,000: the p99 of 200 is their second worst, and moved by half between runs)")
    p.add_argument("--latency-gap-ms", type=float, default=20.0, help="pause between latency jobs (default 20)")
    p.add_argument("--backlog-jobs", type=int, default=1_000_000, help="backlog drain size (default 1,000,000; 0 skips)")
    p.add_argument("--finished-jobs", type=int, default=5_000_000,
                   help="finished jobs kept beside the queue for the plan check (default 5,000,000; 0 skips)")
    p.add_argument("--finished-steps", type=int, default=100_000,
                   help="features: finished workflow steps beside the workflow queries (default 100,000)")
    p.add_argument("--profile", action="store_true",
                   help="after the rounds, two more outboxq drains: one sampled from outside (server activity, "
                        "CPU split), one under cProfile (saved beside --output as .drain.pstats)")
    p.add_argument("--limits", action="store_true",
                   help="with drain: also drain with flow control: non-binding global_concurrency=10000 "
                        "(plain and per key over 100 keys), then the binding global_concurrency=4 on 100 jobs "
                        "of 50 ms and rate_limit=200/s on 5,000 no-op jobs")
    p.add_argument("--flows", type=_flow_names, default=[],
                   help=f"with --limits: only these flow-control drains, comma-separated (of {', '.join(FLOW_NAMES)}; "
                        "default all)")
    p.add_argument("--variant", type=parse_variant, action="append", default=[], metavar="NAME=REV",
                   help="also drain outboxq as it is at git revision REV (e.g. base=HEAD), beside this checkout, "
                        "in the same rounds: each outboxq drain once more as DRAIN@NAME, with its ratio round by "
                        "round (tools/bench_variants.py); repeatable")
    p.add_argument("--dead-rows-jobs", type=int, default=500_000,
                   help="jobs per drain of the deadrows sub-benchmark (default 500,000)")
    p.add_argument("--max-seconds", type=float, default=180.0, help="time limit of one drain (default 180)")
    p.add_argument("--url", help="the PostgreSQL server (default: DATABASE_URL or the embedded one); "
                                 f"databases named {DB_PREFIX}_* are created and dropped there")
    p.add_argument("--peers-venv", default=os.environ.get("OUTBOXQ_BENCH_PEERS_VENV", DEFAULT_PEERS_VENV),
                   help=f"virtual environment for the peers (default {DEFAULT_PEERS_VENV}; created when missing)")
    p.add_argument("--json", action="store_true", help="print the full results as JSON")
    p.add_argument("--output", help="also write the JSON results to this file")
    p.add_argument("--keep", action="store_true", help="keep the benchmark databases")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=cmd_bench)
