"""`python -m tools bench features`: what the newer features cost, each beside the plain path it builds on.

    - a workflow step's hand-off (a diamond's wall time against four plain jobs) and a sequence's throughput
      against a plain queue's (bench/workflow_cost.py);
    - a Spark streaming micro-batch (format("outboxq") in and out) against `outboxq spark run`
      (`python -m tools spark-bench`);
    - ten open dashboards' load on the database server (bench/dashboard_load.py).

Each runs as its own process, as its script runs by hand (the scripts make and drop their own databases on the
benchmark's server), and the lines it prints become this section of the bench's report. A script that fails
is reported with the end of its error output; the others still run.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SPARK_DATABASE = "outboxq_bench_features_spark"


def feature_commands(url: str, *, finished_steps: int, spark_jobs: int, spark_rounds: int,
                     dashboard_seconds: float, dashboard_history: int) -> dict[str, list[str]]:
    """The command of each feature's benchmark against the server of `url`."""
    return {
        "workflows and sequences": [sys.executable, "bench/workflow_cost.py", url, str(finished_steps)],
        "spark streaming": [sys.executable, "-m", "tools", "spark-bench", "--jobs", str(spark_jobs),
                            "--batch-size", str(max(1, spark_jobs // 4)), "--rounds", str(spark_rounds)],
        "dashboards": [sys.executable, "bench/dashboard_load.py", url, "10", f"{dashboard_seconds:g}",
                       str(dashboard_history)],
    }


def _summary_lines(name: str, stdout: str) -> list[str]:
    """The lines of a script's output that carry its figures (the workflow script also prints query plans)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if name == "workflows and sequences":
        return [line for line in lines if line.startswith(("hand-off:", "sequences:", "a workflow of"))]
    return lines


def _spark_database(server: Any) -> str:
    """A migrated database of its own for spark-bench, which reads DATABASE_URL and writes jobs and a table
    there; its URL."""
    from outboxq.queue import migrate

    url = server.recreate(SPARK_DATABASE)
    alembic_log = logging.getLogger("alembic")
    level = alembic_log.level
    alembic_log.setLevel(logging.WARNING)  # (its INFO line per revision is not part of the report)
    try:
        migrate.upgrade(url)
    finally:
        alembic_log.setLevel(level)
    return url


def run_features(url: str, *, finished_steps: int = 100_000, spark_jobs: int = 20_000, spark_rounds: int = 3,
                 dashboard_seconds: float = 30.0, dashboard_history: int = 300_000,
                 timeout_s: float = 1800.0, only: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """Run each feature's benchmark in turn (or those named in `only`); per feature: its command, seconds, the
    figures it printed (and its whole output) or its error."""
    from tools.bench import Server  # (here: tools.bench imports this module)

    server = Server(url)
    results: dict[str, dict[str, Any]] = {}
    commands = feature_commands(url, finished_steps=finished_steps, spark_jobs=spark_jobs, spark_rounds=spark_rounds,
                                dashboard_seconds=dashboard_seconds, dashboard_history=dashboard_history)
    for name, command in commands.items():
        if only and name not in only:
            continue
        spark = name == "spark streaming"  # (the scripts take the server's URL as an argument; spark-bench not)
        env = {**os.environ, "DATABASE_URL": _spark_database(server)} if spark else None
        started = time.monotonic()
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
            outcome: dict[str, Any] = ({"lines": _summary_lines(name, done.stdout), "output": done.stdout}
                                       if done.returncode == 0 else
                                       {"error": f"exit {done.returncode}: {done.stderr.strip()[-1500:]}"})
        except subprocess.TimeoutExpired:
            outcome = {"error": f"no answer within {timeout_s:g} s"}
        finally:
            if spark:
                server.drop(SPARK_DATABASE)
        results[name] = {"command": " ".join(command[1:]), "seconds": round(time.monotonic() - started, 1),
                         **outcome}
    return results


def render_features(features: dict[str, dict[str, Any]] | None) -> list[str]:
    """The features' section of the report: per feature, the command and its figures."""
    if not features:
        return []
    lines = ["features (each beside the plain path it builds on):"]
    for name, result in features.items():
        lines.append(f"- {name} (python {result['command']}, {result['seconds']:g} s):")
        lines += [f"    {line}" for line in result.get("lines", [])]
        if "error" in result:
            lines.append(f"    FAILED: {result['error']}")
    return [*lines, ""]
