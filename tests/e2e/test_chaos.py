"""`python -m tools chaos` scenarios in short configurations: faults injected while jobs, schedules, limited
queues, poisoned handlers, Spark drivers, workflows and sequences run, and every invariant checked."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest

from tools import __main__ as harness
from tools.chaos import FAULT_KINDS, ChaosConfig, format_report, run_chaos
from tools.chaos_more import (
    LimitsScenario,
    MoreConfig,
    PeriodicScenario,
    PoisonScenario,
    WorkflowsScenario,
    format_results,
    lease_segments,
    max_at_once,
    renewed_after_expiry,
    run_more,
)


def test_small_chaos_scenario_loses_nothing_and_runs_nothing_twice():
    # A private embedded server, so that the PostgreSQL-restart fault is injected too.
    config = ChaosConfig(jobs=1500, workers=2, http_fraction=0.05, faults=FAULT_KINDS, fault_interval_s=1.0,
                         timeout_s=240)
    out = io.StringIO()
    report = run_chaos(config, out=out)
    print(format_report(report))
    assert report.ok, report.problems
    assert report.lost == 0 and report.duplicated_effects == 0 and report.phantom == 0
    assert report.jobs_committed > 1000 and report.jobs_over_http > 0
    assert set(report.faults) == set(FAULT_KINDS)
    assert report.dead_as_meant > 0


def test_periodic_schedules_under_faults_make_one_run_per_slot_and_gaps_only_where_the_policy_says():
    result = run_more("periodic", MoreConfig(workers=3, duration_s=8, fault_interval_s=0.5, outage_s=5,
                                             timeout_s=120), out=io.StringIO())
    print(format_results([result]))
    assert result.ok, result.problems
    assert set(result.faults) == set(PeriodicScenario.fault_kinds)
    assert result.lost == result.duplicated == result.not_finished == result.gaps == 0
    details = dict(result.details)
    every_all = next(v for k, v in details.items() if k.startswith("chaos-every-all"))
    every_skip = next(v for k, v in details.items() if k.startswith("chaos-every-skip"))
    # missed="all" catches up: no slot skipped, and at least the run's length in slots (no gap: result.gaps)
    assert int(every_all.split()[0]) >= 8 and " 0 skipped" in every_all
    assert " 0 skipped" not in every_skip  # missed="skip" left the outage's slots out, as documented


def test_limits_under_faults_are_never_exceeded_and_no_job_is_lost_or_run_twice():
    result = run_more("limits", MoreConfig(workers=3, duration_s=10, limit_jobs=250, fault_interval_s=0.5,
                                           timeout_s=120), out=io.StringIO())
    print(format_results([result]))
    assert result.ok, result.problems  # the check also fails when a limit was never reached
    assert set(result.faults) == set(LimitsScenario.fault_kinds)
    assert result.jobs == 250 and result.lost == result.duplicated == result.not_finished == 0
    assert result.limit_exceeded == 0


def test_poisoned_handlers_among_ordinary_jobs_under_faults_end_dead_with_their_error_and_wedge_nothing():
    # 390 jobs: 39 poisoned, three of each of the 13 hostile kinds (NUL, lone surrogate, NaN, 3 MB, 1 MB error,
    # 10,000 levels, unprintable exception...), among ordinary jobs on the same two workers.
    result = run_more("poison", MoreConfig(workers=2, duration_s=8, poison_jobs=390, fault_interval_s=0.5,
                                           timeout_s=120), out=io.StringIO())
    print(format_results([result]))
    # The check also fails when a kind never ended by its own outcome (only by rescues) or a worker exited.
    assert result.ok, result.problems
    assert set(result.faults) == set(PoisonScenario.fault_kinds)
    assert result.jobs == 390 and result.lost == result.duplicated == result.not_finished == 0
    details = dict(result.details)
    # (more than 39 only where a batch whose commit was cut did commit)
    assert details["poisoned jobs"] == details["poisoned jobs ended dead with last_error stored"] >= 39


def test_workflows_and_sequences_under_faults_lose_nothing_double_nothing_and_keep_order():
    # 20 diamonds (80 steps) and 3 sequences of 8 jobs, each in its own transaction, under kills, cuts, a restart
    # of the server and a zombie, on three workers.
    result = run_more("workflows", MoreConfig(workers=3, workflows=20, sequences=3, sequence_jobs=8,
                                              workflow_duration_s=8, fault_interval_s=0.5, timeout_s=120),
                      out=io.StringIO())
    print(format_results([result]))
    assert result.ok, result.problems
    assert set(result.faults) == set(WorkflowsScenario.fault_kinds) and result.faults["kill"] >= 1
    assert result.jobs == 20 * 4 + 3 * 8
    assert result.lost == result.duplicated == result.order_violations == result.not_finished == 0
    details = dict(result.details)
    assert details["workflows done / committed"] == "20 / 20"
    assert details["sequences: runs recorded / jobs committed"] == "24 / 24 in 3 sequences"


def test_the_limit_check_counts_a_lease_revived_after_expiry_and_a_killed_run_until_its_lease_ends():
    t = lambda s: datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=s)  # noqa: E731
    # (job_id, attempt, status, lease_token, lease_expires_at, at), in log order. Limit 1 on the queue.
    clean = [(1, 1, "running", "a", t(3), t(0)), (1, 1, "running", "a", t(4), t(1)), (1, 1, "done", None, None, t(2)),
             (2, 1, "running", "b", t(5), t(2)), (2, 1, "retrying", None, None, t(6))]  # job 2: killed, rescued
    spans = lease_segments(clean)
    assert spans[(2, 1)] == [(t(2), t(5))]  # held until its lease expired, not until the rescue
    assert max_at_once([s for v in spans.values() for s in v]) == 1 and renewed_after_expiry(clean) == 0
    # Job 1's worker froze past its lease (t3); job 2 was claimed in the freed slot; job 1's heartbeat then
    # renewed its expired lease at t4: two valid leases at once from t4.
    revived = [(1, 1, "running", "a", t(3), t(0)), (2, 1, "running", "b", t(6), t(3.5)),
               (1, 1, "running", "a", t(7), t(4)), (1, 1, "done", None, None, t(5)), (2, 1, "done", None, None, t(5.5))]
    spans = lease_segments(revived)
    assert max_at_once([s for v in spans.values() for s in v]) == 2 and renewed_after_expiry(revived) == 1


@pytest.mark.spark
def test_two_spark_drivers_one_killed_mid_batch_deliver_each_result_exactly_once(capsys):
    assert harness.main(["chaos", "--scenario", "spark", "--spark-jobs", "200", "--fault-interval", "1"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| spark |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:6] == ["200", "0", "0", "0"] and cells[-1] == "OK", out
    assert "kill 1" in cells[1] and "terminate" in cells[1]
    sums_line = next(line for line in out.splitlines() if line.startswith("per-customer sums exact"))
    assert sums_line.split()[-1] == "True", out
