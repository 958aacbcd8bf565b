"""A quick run of each script in bench/ with tiny sizes: it still runs against this version and prints its
figures. Speed itself is measured by running the scripts, never asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _run(*args: str, timeout: float = 300) -> str:
    done = subprocess.run([sys.executable, *args], cwd=BENCH, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


@pytest.mark.parametrize("script, args, expected", [
    ("dead_rows.py", ["300"], "with a transaction open throughout"),
    ("many_queues.py", ["10"], "50 queues x 10"),
    ("per_job_cost.py", ["200"], "claim + complete"),
])
def test_issue_17_bench_scripts_run(pg_server_url, script, args, expected):
    assert expected in _run(script, pg_server_url, *args)


def test_flow_claim_explain_runs(pg_server_url):
    out = _run("flow_claim_explain.py", "--url", pg_server_url, "--jobs", "300", "--keys", "5", "--limit", "50",
               "--claims", "3", "--running", "1", "--beside", "40", "--max-keys", "3", "--repeat", "1", "--plan",
               "--generic")
    assert "per_key" in out and "Execution Time" in out and "per_key generic" in out
    assert "40 running jobs of another queue beside them" in out


def test_claim_cpu_runs(pg_server_url):
    out = _run("claim_cpu.py", "--url", pg_server_url, "--jobs", "300", "--keys", "5", "--rounds", "2",
               "global_concurrency:50", "per_key:50:3", "unlimited:50")
    assert "per_key:50:3" in out and "median" in out and "us a job" in out


def test_wakeup_and_notify_runs(pg_server_url):
    out = _run("wakeup_and_notify.py", "--url", pg_server_url, "--jobs", "50", "--samples", "5",
               "--connections", "1")
    assert "latency" in out.lower()


def test_http_load_runs(pg_server_url):
    out = _run("http_load.py", "--seconds", "2", "--threads", "2", "--database-url", pg_server_url)
    assert "lost" in out.lower()


def test_http_phases_runs(pg_server_url):
    out = _run("http_phases.py", "--database-url", pg_server_url, "--requests", "3", "--jobs", "20")
    assert "enqueue_many" in out and "HTTP / Python" in out


def test_http_ab_runs(pg_server_url):
    out = _run("http_ab.py", "--database-url", pg_server_url, "--rounds", "2", "--jobs", "20", "--base", "HEAD")
    assert "base HEAD minimal" in out and "checkout" in out and "of the Python path" in out


def test_operations_latency_runs(pg_server_url):
    out = _run("operations_latency.py", pg_server_url, "3000")
    assert "beside 3,000 finished jobs" in out and "search, matches nothing" in out and "live workers" in out
    assert "queues listing" in out and "one queue" in out and "count, no filter" in out


def test_the_features_section_runs_workflow_cost_and_dashboard_load(pg_server_url):
    """`python -m tools bench features`: each feature's script with tiny sizes, its figures in the report. (Its
    Spark streaming figure is spark-bench's, which test_bench_smoke.py and test_spark_datasource.py run.)"""
    from tools.bench_features import render_features, run_features

    features = run_features(pg_server_url, finished_steps=2000, dashboard_seconds=2, dashboard_history=2000,
                            timeout_s=300, only=("workflows and sequences", "dashboards"))
    assert [name for name, result in features.items() if "error" in result] == [], features
    workflows = features["workflows and sequences"]
    assert "outboxq_jobs_workflow_step_idx" in workflows["output"] and "Execution Time" in workflows["output"]
    assert [line.split()[0] for line in workflows["lines"]] == ["hand-off:", "sequences:", "a"]
    assert "hand-off: a diamond" in workflows["lines"][0] and "a workflow of 1,000 steps" in workflows["lines"][2]
    assert any("10 dashboards reading the overview" in line and "of one core" in line
               for line in features["dashboards"]["lines"])
    report = "\n".join(render_features(features))
    assert report.startswith("features (") and "python bench/dashboard_load.py" in report


def test_drain_skew_runs(pg_server_url):
    out = _run("drain_skew.py", pg_server_url, "1", "2000", "2")
    assert "round 1:" in out and "jobs/s from the first job started" in out
    ran = [int(line.split()[1].replace(",", "")) for line in out.splitlines() if "jobs  first at" in line]
    assert sum(ran) == 2000  # every job, by the worker processes listed
