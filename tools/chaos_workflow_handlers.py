"""Handlers of `python -m tools chaos --scenario workflows` (workers import this with `--handlers`).

Imported only by the scenario (its workers, and its own process for the constants below), never by
tools/chaos.py at import: its queues must appear in no other worker (and the product never imports tools).

Diamond workflows (fetch -> left, right -> join), each step on a queue of its own, and sequences of jobs on
chaos-seq. Every step writes its effect through ctx.transaction() into chaos_wf_effects, recording what it saw
(its workflow, its step's name, its parents' results) and the value it hands on; the join's value is the sum
of its parents'. Every sequence job records its run (sequence, n, start, end) through ctx.transaction() into
chaos_seq_runs. Neither table has a unique key: an effect or run committed twice would show as a second row.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime

from outboxq.workers import JobContext, consumer
from tools.chaos_handlers import OPTIONS

FETCH_QUEUE, LEFT_QUEUE, RIGHT_QUEUE, JOIN_QUEUE = "chaos-wf-fetch", "chaos-wf-left", "chaos-wf-right", "chaos-wf-join"
SEQ_QUEUE = "chaos-seq"
STEP_QUEUES = {"fetch": FETCH_QUEUE, "left": LEFT_QUEUE, "right": RIGHT_QUEUE, "join": JOIN_QUEUE}
EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS chaos_wf_effects (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL,
    workflow_id bigint,
    step text,
    parents jsonb NOT NULL,
    value bigint,
    attempt int NOT NULL,
    pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
SEQ_RUNS_DDL = """
CREATE TABLE IF NOT EXISTS chaos_seq_runs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL,
    sequence text NOT NULL,
    n int NOT NULL,
    attempt int NOT NULL,
    pid int NOT NULL,
    started_at timestamptz NOT NULL,
    ended_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def left_value(fetched: int) -> int:
    return 2 * fetched


def right_value(fetched: int) -> int:
    return fetched + 3


def _work(payload: dict) -> None:
    """Tens of milliseconds of work, so that kills and freezes land mid-handler."""
    time.sleep(payload.get("work_ms", 30) / 1000)


def _value_of(step: str, payload: dict, parents: dict) -> int | None:
    """What the step hands on: fetch its payload's base, left and right a function of fetch's, join the sum of
    left's and right's (None where a parent's result is missing: the check reports it)."""
    def parent(name: str) -> int | None:
        result = parents.get(name)
        return result.get("value") if isinstance(result, dict) else None

    if step == "fetch":
        return int(payload["base"])
    if step in ("left", "right"):
        fetched = parent("fetch")
        return None if fetched is None else (left_value if step == "left" else right_value)(fetched)
    values = [parent("left"), parent("right")]
    return None if None in values else sum(values)


def step(payload: dict, ctx: JobContext) -> dict:
    """A workflow step: read its place, work, write its effect (and complete) in one transaction, hand on its
    value as its result."""
    parents = ctx.parent_results
    name = ctx.step
    _work(payload)
    value = _value_of(name, payload, parents)
    with ctx.transaction() as conn:
        conn.execute("INSERT INTO chaos_wf_effects (job_id, workflow_id, step, parents, value, attempt, pid) "
                     "VALUES (%s, %s, %s, %s::jsonb, %s, %s, %s)",
                     (ctx.job_id, ctx.workflow_id, name, json.dumps(parents), value, ctx.attempt, os.getpid()))
        ctx.set_result({"value": value})  # stored with the effect: the next steps see it whatever dies
    return {"value": value}


def sequenced(payload: dict, ctx: JobContext) -> None:
    """A sequence's job: records when it started and (in its transaction, which completes it) when it ended."""
    started = datetime.now(UTC)
    _work(payload)
    with ctx.transaction() as conn:
        conn.execute("INSERT INTO chaos_seq_runs (job_id, sequence, n, attempt, pid, started_at) "
                     "VALUES (%s, %s, %s, %s, %s, %s)",
                     (ctx.job_id, payload["sequence"], payload["n"], ctx.attempt, os.getpid(), started))


for _queue in STEP_QUEUES.values():
    consumer(_queue, **OPTIONS)(step)
consumer(SEQ_QUEUE, **OPTIONS)(sequenced)
