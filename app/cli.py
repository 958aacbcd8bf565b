"""The `outboxq` command: migrate, serve, worker, demo, and the operator's commands."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from outboxq.errors import OutboxqError, SchemaOutOfDate


def _url() -> str:
    from outboxq.db import database_url

    return database_url()


def _current_url(wait: bool = False) -> str:
    """The database URL, refusing to go on when its schema is not migrated to this version. With `wait` (the
    long-running commands: worker, spark run), first waits up to OUTBOXQ_DB_WAIT_S for the database to answer:
    started beside a database that is (re)starting, they wait rather than exit (an unmigrated schema is
    refused at once: it needs `outboxq migrate`)."""
    from outboxq.queue.migrate import ensure_current, wait_until_current
    from outboxq.settings import get_settings

    url = _url()
    if wait:
        wait_until_current(url, get_settings().db_wait_s, wait_for_migration=False)
    else:
        ensure_current(url)
    return url


def _print(rows: list[dict[str, Any]], columns: Sequence[str], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, default=str, indent=2))
        return
    if not rows:
        print("(none)")
        return
    widths = {c: max(len(c), *(len(_cell(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    print("  ".join("-" * widths[c] for c in columns))
    for r in rows:
        print("  ".join(_cell(r.get(c)).ljust(widths[c]) for c in columns))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    text = str(value).replace("\n", " ")
    return text if len(text) <= 80 else text[:77] + "..."


# ---------------------------------------------------------------- commands


def cmd_migrate(args: argparse.Namespace) -> int:
    """Apply the migrations."""
    from outboxq.queue.migrate import upgrade

    revision = upgrade(_url())
    print(f"schema is at revision {revision}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the HTTP service."""
    from outboxq.api.server import serve
    from outboxq.settings import get_settings

    _current_url()
    settings = get_settings()
    if args.host:
        settings.host = args.host
    if args.port:
        settings.port = args.port
    serve(settings)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    """Run a worker for the consumers of the given handler modules until SIGTERM/SIGINT."""
    from outboxq.gc_tuning import tune_collector
    from outboxq.settings import get_settings
    from outboxq.workers.registry import load_handler_modules
    from outboxq.workers.runner import Worker

    url = _current_url(wait=True)
    processes = _worker_processes(args.processes or get_settings().worker_processes)
    if processes > 1:
        return _run_worker_processes(args, url, processes)
    consumers = load_handler_modules(args.handlers.split(","))
    if args.queues:
        wanted = set(args.queues.split(","))
        consumers = [c for c in consumers if c.queue in wanted]
    worker = Worker(consumers, url=url, concurrency=args.concurrency, batch_size=args.batch_size,
                    poll_interval=args.poll_interval, metrics_port=args.metrics_port)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: worker.request_stop())
    tune_collector()  # (this process is the worker's own: see outboxq.gc_tuning)
    worker.run()
    return 0


def _worker_processes(value: str) -> int:
    """--processes: a positive number, or "auto" (one per core)."""
    from outboxq.workers.processes import default_count

    if value == "auto":
        return default_count()
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"outboxq worker: --processes must be a positive number or 'auto', not {value!r}")
    return int(value)


def _run_worker_processes(args: argparse.Namespace, url: str, processes: int) -> int:
    """The worker as `processes` child workers under a supervisor (outboxq.workers.processes)."""
    from outboxq.workers.processes import Supervisor

    def child_argv(index: int) -> list[str]:
        argv = ["--log-level", args.log_level, "worker", "--handlers", args.handlers, "--processes", "1"]
        for flag, value in (("--queues", args.queues), ("--concurrency", args.concurrency),
                            ("--batch-size", args.batch_size), ("--poll-interval", args.poll_interval),
                            ("--metrics-port", None if args.metrics_port is None else args.metrics_port + index)):
            if value is not None:
                argv += [flag, str(value)]
        return argv

    os.environ["DATABASE_URL"] = url  # the children connect where this process would have
    supervisor = Supervisor(processes, child_argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: supervisor.request_stop())
    return supervisor.run()


def cmd_demo(args: argparse.Namespace) -> int:
    """Migrate, run example handlers on business transactions, and check the outcome."""
    from outboxq.demo import run_demo
    from outboxq.queue.migrate import upgrade

    url = _url()
    upgrade(url)
    return run_demo(url, orders=args.orders, example_dir=args.example_dir)


def cmd_queues(args: argparse.Namespace) -> int:
    """A table of queues with their job counts per status, then the limited queues' limits and usage."""
    from outboxq.db import connect
    from outboxq.queue import admin, limits
    from outboxq.queue.jobs import JobStatus

    if getattr(args, "queues_command", None) == "limit":
        return cmd_queues_limit(args)
    with connect(_current_url()) as conn:
        infos = admin.queue_counts(conn)
        usage = limits.usage(conn)
    rows = [{"queue": i.queue, "paused": i.paused, **i.counts} for i in infos]
    if args.json:
        print(json.dumps({"queues": rows, "limits": usage}, default=str, indent=2))
        return 0
    _print(rows, ["queue", "paused", *(s.value for s in JobStatus)], False)
    print(f"(done, dead and cancelled: finished within the last {admin.FINISHED_COUNTS_WINDOW_S / 3600:g} h)",
          file=sys.stderr)
    if usage:
        print("\nlimits (per key where per_key; running now, starts within the rate window)")
        for r in usage:
            r["busiest_keys"] = ", ".join(f"{k['key']}:{k['running']}" for k in r["busiest_keys"]) or None
        _print(usage, ["queue", "global_concurrency", "rate_limit", "per_key", "source", "running",
                       "recent_starts", "busiest_keys"], False)
    return 0


def cmd_periodic(args: argparse.Namespace) -> int:
    """The periodic schedules the workers wrote: their last and next slots."""
    from outboxq.db import connect
    from outboxq.workers.periodic import stored_schedules

    with connect(_current_url()) as conn:
        rows = stored_schedules(conn)
    if args.json:
        print(json.dumps(rows, default=str, indent=2))
        return 0
    if not rows:
        print("no periodic schedules yet (a worker writes those its handler modules define when it starts)")
        return 0
    _print(rows, ["name", "queue", "spec", "timezone", "missed", "last_slot", "next_slot", "last_job_id",
                  "last_job_status"], False)
    return 0


def cmd_queues_limit(args: argparse.Namespace) -> int:
    """Change a queue's limits at run time (every worker applies them within a few seconds)."""
    from outboxq.db import connect
    from outboxq.queue import limits

    with connect(_current_url()) as conn:
        if args.reset:
            limits.reset_limits(conn, args.queue)
            conn.commit()
            print(f"queue {args.queue}: limits back to what its consumers declare")
            return 0
        set_concurrency = args.global_concurrency is not None or args.no_global_concurrency
        set_rate = args.rate_limit is not None or args.no_rate_limit
        if not (set_concurrency or set_rate):
            print("give --global-concurrency N, --rate-limit N/s|N/m|N/h, --no-global-concurrency, "
                  "--no-rate-limit or --reset", file=sys.stderr)
            return 2
        result = limits.set_limits(conn, args.queue, global_concurrency=args.global_concurrency,
                                   rate_limit=args.rate_limit, set_concurrency=set_concurrency,
                                   set_rate=set_rate)
        conn.commit()
    concurrency = "unlimited" if result.global_concurrency is None else result.global_concurrency
    print(f"queue {result.queue}: global concurrency {concurrency}, "
          f"rate limit {result.rate_limit or 'none'}{' (per key)' if result.per_key else ''}")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    """Pause or resume a queue."""
    from outboxq.db import connect
    from outboxq.queue import admin

    with connect(_current_url()) as conn:
        admin.set_paused(conn, args.queue, args.command == "pause")
    print(f"queue {args.queue} {'paused' if args.command == 'pause' else 'resumed'}")
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    """Job operations: errors of a queue, retry, cancel, show."""
    from outboxq import Job, get_job
    from outboxq.db import connect
    from outboxq.queue import admin

    with connect(_current_url()) as conn:
        if args.jobs_command == "errors":
            jobs = admin.list_errors(conn, args.queue, limit=args.limit)
            _print([j.to_dict() for j in jobs], ["id", "status", "attempts", "max_attempts", "last_error"],
                   args.json)
            return 0
        job: Job | None
        if args.jobs_command == "retry":
            job = admin.retry_job(conn, args.id)
        elif args.jobs_command == "cancel":
            job = admin.cancel_job(conn, args.id)
        else:
            job = get_job(conn, args.id)
            if job is None:
                print(f"no job has id {args.id}", file=sys.stderr)
                return 1
        conn.commit()
    out = job.to_dict()
    print(json.dumps(out, default=str, indent=2) if args.json else
          f"job {job.id} ({job.queue}): {job.status.value}, attempts {job.attempts}")
    return 0


def cmd_workflows(args: argparse.Namespace) -> int:
    """Workflows: the newest ones, or one shown, cancelled or retried."""
    from outboxq.db import connect
    from outboxq.errors import WorkflowNotFound
    from outboxq.queue import workflows

    with connect(_current_url()) as conn:
        if args.workflows_command is None:
            rows = workflows.list_workflows(conn, limit=args.limit)
            _print(rows, ["id", "name", "status", "steps", "done", "unfinished", "dead", "cancelled", "created_at"],
                   args.json)
            return 0
        if args.workflows_command == "cancel":
            out: Any = {"cancelled": workflows.cancel_workflow(conn, args.id)}
        elif args.workflows_command == "retry":
            out = workflows.retry_workflow(conn, args.id)
        else:
            info = workflows.get_workflow(conn, args.id)
            if info is None:
                raise WorkflowNotFound(args.id)
            out = info.to_dict()
            if not args.json:
                print(f"workflow {info.id} ({info.name}): {info.status}")
                _print([s.to_dict() for s in info.steps], ["name", "job_id", "queue", "status", "attempts"], False)
                return 0
        conn.commit()
    print(json.dumps(out, default=str, indent=2) if args.json else
          ", ".join(f"{k} {v}" for k, v in out.items()))
    return 0


def cmd_workers(args: argparse.Namespace) -> int:
    """The live worker processes: host, pid, queues, jobs in flight, last seen."""
    from outboxq.db import connect
    from outboxq.queue import admin

    with connect(_current_url()) as conn:
        rows = admin.live_workers(conn)
    for row in rows:
        row["queues"] = ",".join(q["queue"] for q in row["queues"]) if not args.json else row["queues"]
    _print(rows, ["id", "host", "pid", "version", "queues", "concurrency", "in_flight", "started_at",
                  "last_seen_at"], args.json)
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """Retry and processing-time statistics per queue."""
    from outboxq.db import connect
    from outboxq.queue import admin

    with connect(_current_url()) as conn:
        retries = admin.retry_stats(conn, age_days=args.age_days, queue=args.queue)
        times = admin.processing_time_stats(conn, age_days=args.age_days, queue=args.queue)
    if args.json:
        print(json.dumps({"retries": retries, "processing_time": times}, default=str, indent=2))
        return 0
    print(f"retries (last {args.age_days} days)")
    _print(retries, ["queue", "ok", "retries", "dead", "retry_percentage"], False)
    print(f"\nprocessing time in ms (last {args.age_days} days)")
    _print(times, ["queue", "jobs", "avg_ms", "min_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms"], False)
    return 0


def cmd_create_role(args: argparse.Namespace) -> int:
    """Create the least-privilege role one component (api, worker, spark, or all) runs as."""
    from outboxq.db import connect
    from outboxq.queue.roles import PROFILES, create_app_role, lock_down_public, public_reach
    from outboxq.settings import get_settings

    settings = get_settings()
    url = _current_url()
    password = _role_password(args)
    with connect(url) as conn:
        created = create_app_role(conn, args.role, component=args.component, password=password,
                                  schema=settings.db_schema, results_schema=settings.spark_results_schema,
                                  statement_timeout_s=args.statement_timeout,
                                  connection_limit=args.connection_limit, update_existing=args.update_existing)
        locked = lock_down_public(conn) if args.lock_down_public else None
        conn.commit()
        reach = public_reach(conn, args.role)
    profile = PROFILES[args.component]
    print(f"role {args.role} {'created' if created else 'updated'} for {args.component}: it reads and writes "
          f"outboxq's rows{'' if profile.deletes_everywhere else ' (deleting only queue limits)'}, changes no "
          f"schema, statement_timeout {args.statement_timeout or profile.statement_timeout_s:g} s, at most "
          f"{args.connection_limit or profile.connection_limit} connections"
          f"{', no password' if created and password is None else ''}")
    if locked is not None:
        print("revoked from PUBLIC: TEMPORARY on this database"
              + (f", CONNECT on {', '.join(locked)}" if locked else "")
              + " (roles without a grant of their own, other than owners and superusers, lost them too)")
    if reach:
        can = (["create temporary tables in this database"] if reach.temporary else []) + (
            [f"connect to {', '.join(reach.other_databases)}"] if reach.other_databases else [])
        print(f"note: role {args.role} may still {' and '.join(can)}: PostgreSQL grants PUBLIC, so every role, "
              "CONNECT and TEMPORARY on each database. --lock-down-public revokes them from PUBLIC (every role "
              "of the server loses what it held only that way); pg_hba.conf can also keep the role to its "
              "database.", file=sys.stderr)
    return 0


# What `create-role --password VALUE` answers: a password given as an argument is seen by every user of the
# machine (ps, /proc/PID/cmdline) and kept in the shell's history.
PASSWORD_ARGUMENT_REFUSED = ("a password on the command line is visible to other users (ps) and kept in shell "
                             "history: use --password-file PATH, --password-env NAME, or type it at the prompt "
                             "(no password option, on a terminal)")


class _RefusedPassword(argparse.Action):
    """--password, refused whatever its value (PASSWORD_ARGUMENT_REFUSED)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        raise argparse.ArgumentError(self, PASSWORD_ARGUMENT_REFUSED)


def _role_password(args: argparse.Namespace) -> str | None:
    """The password of `create-role`: from --password-file, --password-env, or asked on a terminal (twice);
    None (no password: the role logs in only where pg_hba.conf needs none) when stdin is no terminal or the
    answer is empty."""
    import getpass

    if args.password_file:
        try:
            # A file written by echo or an editor ends with a newline, which is no part of the password.
            password = Path(args.password_file).read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise SystemExit(f"outboxq create-role: cannot read --password-file: {exc}") from None
        source = f"the file {args.password_file}"
    elif args.password_env:
        password = os.environ.get(args.password_env, "")
        source = f"the environment variable {args.password_env}"
    elif sys.stdin.isatty():
        password = getpass.getpass(f"password of role {args.role} (empty: none): ")
        if password and getpass.getpass("the same again: ") != password:
            raise SystemExit("outboxq create-role: the two passwords differ")
        return password or None
    else:
        return None
    if not password:
        raise SystemExit(f"outboxq create-role: {source} holds no password")
    return password


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="outboxq", description=__doc__)
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="apply the database migrations").set_defaults(func=cmd_migrate)
    _add_run_commands(sub)
    _add_operator_commands(sub)
    _add_create_role(sub)
    # Imported explicitly: a broken import is an error with its message. It imports its heavy dependency
    # (PySpark) only when its command runs. (The benchmark and chaos harness is not part of the package: it is
    # run from a checkout, `python -m tools bench|chaos`.)
    from outboxq.spark_jobs import cli as spark_cli

    spark_cli.register(sub)
    return parser


def _add_run_commands(sub: Any) -> None:
    """The commands that run something: serve, worker, demo."""

    p = sub.add_parser("serve", help="run the HTTP service")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("worker", help="run a worker")
    p.add_argument("--handlers", required=True, help="comma-separated modules whose @consumer handlers to run")
    p.add_argument("--queues", help="only these queues (comma-separated)")
    p.add_argument("--concurrency", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--poll-interval", type=float)
    p.add_argument("--metrics-port", type=int,
                   help="serve this worker's Prometheus metrics on 127.0.0.1:PORT/metrics (with --processes N, "
                        "one port per process: PORT to PORT+N-1)")
    p.add_argument("--processes",
                   help="worker processes under one supervisor: N, or 'auto' (one per core, at most 4); default "
                        "OUTBOXQ_WORKER_PROCESSES, else auto")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("demo", help="run the demo on the embedded (or configured) PostgreSQL")
    p.add_argument("--orders", type=int, default=300)
    p.add_argument("--example-dir", help="the example shop's folder (default: ./examples/shop)")
    p.set_defaults(func=cmd_demo)


def _add_operator_commands(sub: Any) -> None:
    """The commands that look at or change the queue: periodic, queues, pause/resume, jobs, stats."""
    p = sub.add_parser("periodic", help="the periodic schedules, their last and next slots")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_periodic)

    p = sub.add_parser("queues", help="queues and their job counts, limits and usage")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_queues)
    queues_sub = p.add_subparsers(dest="queues_command")
    lim = queues_sub.add_parser("limit", help="change a queue's concurrency and rate limits at run time")
    lim.add_argument("queue")
    lim.add_argument("--global-concurrency", type=int, help="at most N running (per key with limit_by)")
    lim.add_argument("--rate-limit", help="at most N starts per period: N/s, N/m or N/h (per key with limit_by)")
    lim.add_argument("--no-global-concurrency", action="store_true", help="remove the concurrency limit")
    lim.add_argument("--no-rate-limit", action="store_true", help="remove the rate limit")
    lim.add_argument("--reset", action="store_true", help="forget the operator's limits: the consumers' apply")

    for name in ("pause", "resume"):
        p = sub.add_parser(name, help=f"{name} a queue")
        p.add_argument("queue")
        p.set_defaults(func=cmd_pause)

    p = sub.add_parser("jobs", help="job operations")
    jobs_sub = p.add_subparsers(dest="jobs_command", required=True)
    e = jobs_sub.add_parser("errors", help="retrying and dead jobs of a queue")
    e.add_argument("queue")
    e.add_argument("--limit", type=int, default=100)
    e.add_argument("--json", action="store_true")
    for name in ("retry", "cancel", "show"):
        j = jobs_sub.add_parser(name, help=f"{name} a job")
        j.add_argument("id", type=int)
        j.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("workflows", help="the newest workflows and their status; show, cancel or retry one")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_workflows)
    workflows_sub = p.add_subparsers(dest="workflows_command")
    for name in ("show", "cancel", "retry"):
        w = workflows_sub.add_parser(name, help=f"{name} a workflow")
        w.add_argument("id", type=int)
        w.add_argument("--json", action="store_true")

    p = sub.add_parser("workers", help="the live worker processes, their queues and jobs in flight")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_workers)

    p = sub.add_parser("stats", help="retry and processing-time statistics")
    p.add_argument("--age-days", type=float, default=1.0)
    p.add_argument("--queue")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stats)


def _add_create_role(sub: Any) -> None:
    """create-role: the least-privilege database role of one component."""
    p = sub.add_parser("create-role", help="create the least-privilege database role of one component")
    p.add_argument("role")
    p.add_argument("--for", dest="component", choices=["api", "worker", "spark", "all"], default="all",
                   help="the component that runs as this role (default all: every right any component uses)")
    secret = p.add_mutually_exclusive_group()
    secret.add_argument("--password-file", metavar="PATH",
                        help="read the role's password from this file (a trailing newline is dropped; a Docker "
                             "secret, say). Without it or --password-env, asked on a terminal, else none")
    secret.add_argument("--password-env", metavar="NAME",
                        help="read the role's password from the environment variable NAME")
    secret.add_argument("--password", nargs="?", action=_RefusedPassword, help=argparse.SUPPRESS)
    p.add_argument("--statement-timeout", type=float, help="seconds (default per component: 15, 60, 600)")
    p.add_argument("--connection-limit", type=int, help="default per component: api 40, worker 200, spark 40")
    p.add_argument("--update-existing", action="store_true",
                   help="when the role exists, bring it to this component's rights and limits (and the given "
                        "password; without one it keeps its own) instead of failing: for a deployment that runs "
                        "create-role at each start")
    p.add_argument("--lock-down-public", action="store_true",
                   help="also revoke from PUBLIC the TEMPORARY privilege on this database and CONNECT on every "
                        "other database of the server, so that the role can neither create temporary tables nor "
                        "connect elsewhere. PUBLIC is every role: those that held these only through PUBLIC lose "
                        "them too (owners and superusers keep them). Meant for a server of outboxq's own")
    p.set_defaults(func=cmd_create_role)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `outboxq` console script."""
    return run(build_parser(), argv, "outboxq")


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None, name: str) -> int:
    """Parse, configure logging (--log-level), run the subcommand; an outboxq error or a database that does
    not answer is one line on stderr under `name` and the exit status (2: the schema is out of date; 1)."""
    import psycopg

    from outboxq.logs import configure_logging

    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        return int(args.func(args) or 0)
    except SchemaOutOfDate as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    except OutboxqError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
    except psycopg.OperationalError as exc:  # the database did not answer (after waiting, where a command waits)
        print(f"{name}: cannot reach the database: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
