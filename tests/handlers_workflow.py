"""Handlers of the workflow and sequence tests, run by worker subprocesses (`outboxq worker --handlers`).

Every step writes its effect through ctx.transaction() (exactly once, whatever dies; the tables have no unique
key, so a second run with effects would show as a second row), recording what it saw:
its workflow, its step's name and its parents' results. Sequence jobs record when they started and ended.
The gated step says when it started, waits for its gate, and says how its transaction ended (files).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from outboxq.workers import JobContext, consumer

EFFECTS_DDL = ("CREATE TABLE IF NOT EXISTS test_wf_effects (job_id bigint, workflow_id bigint, "
               "step text, parents jsonb, pid int, at timestamptz DEFAULT clock_timestamp())")
SEQUENCE_DDL = ("CREATE TABLE IF NOT EXISTS test_seq_runs (job_id bigint, sequence text, n int, "
                "started_at timestamptz, ended_at timestamptz DEFAULT clock_timestamp())")


def _step(payload: dict, ctx: JobContext) -> dict:
    """Record the step's effect once; fail first when the payload says so ("fail", or "fail_until" a file
    exists); return a result for the next."""
    if payload.get("fail") or (payload.get("fail_until") and not os.path.exists(payload["fail_until"])):
        raise RuntimeError(f"step {ctx.step} fails as asked")
    time.sleep(payload.get("seconds", 0))
    parents = ctx.parent_results
    result = {"step": ctx.step, "value": payload.get("value", 1)}
    with ctx.transaction() as conn:
        conn.execute("INSERT INTO test_wf_effects (job_id, workflow_id, step, parents, pid) "
                     "VALUES (%s, %s, %s, %s::jsonb, %s)",
                     (ctx.job_id, ctx.workflow_id, ctx.step, _json(parents), os.getpid()))
        if not payload.get("return_only"):  # (the diamonds' right step returns its result instead)
            ctx.set_result(result)
    return result


def _json(value: object) -> str:
    import json

    return json.dumps(value)


for _queue in ("wf-fetch", "wf-left", "wf-right", "wf-join", "wf-fan"):
    consumer(_queue, max_attempts=2, lease_s=5)(_step)


@consumer("wf-sum", max_attempts=2, lease_s=5)
def total(payload: dict, ctx: JobContext) -> dict:
    """The join of a fan-out: the sum of every parent's value."""
    parents = ctx.parent_results
    result = {"sum": sum(r["value"] for r in parents.values())}
    with ctx.transaction() as conn:
        conn.execute("INSERT INTO test_wf_effects (job_id, workflow_id, step, parents, pid) "
                     "VALUES (%s, %s, %s, %s::jsonb, %s)",
                     (ctx.job_id, ctx.workflow_id, ctx.step, _json({"count": len(parents)}), os.getpid()))
        ctx.set_result(result)
    return result


@consumer("wf-gated", max_attempts=1, lease_s=5)
def gated(payload: dict, ctx: JobContext) -> dict:
    """A step that writes the file `started`, waits (at most 60 s) for the file `gate`, then writes its effect
    through ctx.transaction(), and writes to the file `outcome` how that ended: "committed", or the name of the
    exception it raised (LeaseLost once the step was cancelled while it waited)."""
    _write(payload["started"], str(os.getpid()))
    deadline = time.monotonic() + 60
    while not os.path.exists(payload["gate"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        with ctx.transaction() as conn:
            conn.execute("INSERT INTO test_wf_effects (job_id, workflow_id, step, parents, pid) "
                         "VALUES (%s, %s, %s, %s::jsonb, %s)",
                         (ctx.job_id, ctx.workflow_id, ctx.step, _json(ctx.parent_results), os.getpid()))
            ctx.set_result({"step": ctx.step, "value": payload.get("value", 1)})
    except BaseException as exc:
        _write(payload["outcome"], type(exc).__name__)
        raise
    _write(payload["outcome"], "committed")
    return {"step": ctx.step, "value": payload.get("value", 1)}


def _write(path: str, text: str) -> None:
    """Write the file whole (a reader never sees it half written)."""
    Path(path + ".tmp").write_text(text)
    os.replace(path + ".tmp", path)


@consumer("seq", max_attempts=3, lease_s=5)
def sequenced(payload: dict, ctx: JobContext) -> None:
    """A sequence's job: records when it started and (in its transaction) when it ended; fails, recording
    nothing, while the payload's "fail_until" file does not exist."""
    from datetime import UTC, datetime

    if payload.get("fail_until") and not os.path.exists(payload["fail_until"]):
        raise RuntimeError(f"sequence job {payload['n']} fails as asked")
    started = datetime.now(UTC)
    time.sleep(payload.get("seconds", 0.01))
    with ctx.transaction() as conn:
        conn.execute("INSERT INTO test_seq_runs (job_id, sequence, n, started_at) VALUES (%s, %s, %s, %s)",
                     (ctx.job_id, payload["sequence"], payload["n"], started))
