"""A small `outboxq chaos` scenario: faults injected while jobs run, and every invariant checked."""

from __future__ import annotations

import io

from outboxq.tools.chaos import FAULT_KINDS, ChaosConfig, format_report, run_chaos


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
