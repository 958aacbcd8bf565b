"""Poison-proof outcomes: nothing a handler returns or raises stops the completer writing the others, and
results, errors and tracebacks are stored within their bounds (real PostgreSQL, in-process workers)."""

from __future__ import annotations

import json
import math
import threading
from collections import Counter

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from outboxq import enqueue
from outboxq.settings import Settings
from outboxq.workers.executor import Outcome
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker
from tests.support import wait_for


class _BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


# What each poisoned job's handler does, and a text its job's last error must hold.
POISON = {
    "nul_result": (lambda: {"s": "a\x00b"}, "result not storable: the result holds a NUL character"),
    "nul_error": (lambda: (_ for _ in ()).throw(ValueError("bad\x00value")), "ValueError: bad\\x00value"),
    "nan_result": (lambda: {"x": math.nan}, "result not storable: the result is not JSON"),
    "infinity_result": (lambda: [math.inf], "result not storable: the result is not JSON"),
    "object_result": (lambda: {"o": object()}, "result not storable: the result is not JSON"),
    "set_result": (lambda: {1, 2}, "result not storable: the result is not JSON"),
    "surrogate_result": (lambda: {"s": "\ud800"}, "result not storable: the result holds a lone UTF-16"),
    "surrogate_error": (lambda: (_ for _ in ()).throw(KeyError("\udfff")), "KeyError: '\\udfff'"),
    "unprintable_error": (lambda: (_ for _ in ()).throw(_BadStr()), "_BadStr: <_BadStr whose str() raised"),
}


def _rows(url: str, ids: list[int]) -> dict[int, dict]:
    with psycopg.connect(url, row_factory=dict_row) as c:
        rows = c.execute("SELECT id, status, attempts, result, last_error, last_traceback FROM outboxq_jobs "
                         "WHERE id = ANY(%s)", (ids,)).fetchall()
    return {r["id"]: r for r in rows}


def test_hostile_outcomes_fail_alone_and_twenty_ordinary_jobs_complete_once_each(db_url):
    runs: Counter[int] = Counter()
    lock = threading.Lock()

    def handler(payload, ctx):
        with lock:
            runs[ctx.job_id] += 1
        if "poison" in payload:
            return POISON[payload["poison"]][0]()
        return {"n": payload["n"]}

    worker = Worker([Consumer("mixed", handler, max_attempts=1)], url=db_url, poll_interval=0.05,
                    run_maintenance=False, concurrency=4)
    with psycopg.connect(db_url) as c:  # enqueued before the worker starts: claimed and completed together
        ordinary = [enqueue(c, "mixed", {"n": n}).id for n in range(20)]
        poisoned = {enqueue(c, "mixed", {"poison": name}).id: name for name in POISON}
        c.commit()
    worker.start()
    try:
        every = ordinary + list(poisoned)
        wait_for(lambda: all(r["status"] in ("done", "dead") for r in _rows(db_url, every).values()), timeout=20)
    finally:
        worker.stop(timeout=5)
    rows = _rows(db_url, ordinary + list(poisoned))
    for n, job_id in enumerate(ordinary):
        assert rows[job_id]["status"] == "done" and rows[job_id]["result"] == {"n": n}
    for job_id, name in poisoned.items():
        assert rows[job_id]["status"] == "dead", name
        assert POISON[name][1] in rows[job_id]["last_error"], (name, rows[job_id]["last_error"])
    assert set(runs.values()) == {1} and len(runs) == len(rows)  # every job ran once, none again


def _json_values():
    """Any JSON-ish value, hostile ones included: any text (NUL, lone surrogates), any float, nesting."""
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)


def _hostile_json(value) -> str:
    """JSON text the executor would have refused (NaN, Infinity, \\u0000, lone surrogates as escapes)."""
    return json.dumps(value, allow_nan=True, default=repr)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(outcomes=st.lists(st.tuples(st.sampled_from(["result", "error", "snooze"]), _json_values(), st.text()),
                         min_size=1, max_size=4))
def test_the_completer_writes_every_outcome_it_can_and_fails_the_ones_postgresql_refuses(db_url, outcomes):
    """Outcomes built past the executor's checks (so that PostgreSQL itself refuses some of them), among
    ordinary successes: every job leaves `running`, the ordinary ones are done with their results."""
    consumer = Consumer("generated", lambda payload, ctx: None, max_attempts=1)
    worker = Worker([consumer], url=db_url, listen=False, run_maintenance=False)
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        for n in range(len(outcomes) + 3):
            enqueue(conn, "generated", {"n": n})
        conn.commit()
        jobs = worker.claim(conn, consumer, len(outcomes) + 3)
    assert len(jobs) == len(outcomes) + 3
    batch = []
    for job, (kind, value, text) in zip(jobs, outcomes, strict=False):
        if kind == "result":
            batch.append(Outcome(job=job, succeeded=True, result=value, result_json=_hostile_json(value)))
        elif kind == "error":
            batch.append(Outcome(job=job, succeeded=False, error=text, traceback=_hostile_json(value)))
        else:
            outcome = Outcome(job=job, succeeded=False, error=text)
            outcome.snooze_s = 60.0
            batch.append(outcome)
    ordinary = jobs[len(outcomes):]
    batch += [Outcome(job=job, succeeded=True, result=job.payload, result_json=json.dumps(job.payload))
              for job in ordinary]
    conn = worker.completer._connect()
    try:
        pending = list(batch)
        worker.completer.write_isolating(conn, pending)
    finally:
        conn.close()
    assert pending == []
    rows = _rows(db_url, [j.id for j in jobs])
    assert not [r for r in rows.values() if r["status"] == "running"]
    for job in ordinary:
        assert rows[job.id]["status"] == "done" and rows[job.id]["result"] == job.payload


def test_a_50_mb_result_fails_its_attempt_and_a_20_mb_error_is_stored_cut(db_url):
    big = "x" * 50_000_000

    def handler(payload, ctx):
        if payload["kind"] == "result":
            return {"big": big}
        raise RuntimeError("e" * 20_000_000)

    worker = Worker([Consumer("big", handler, max_attempts=1)], url=db_url, poll_interval=0.05,
                    run_maintenance=False, settings=Settings())
    with psycopg.connect(db_url) as c:
        ids = [enqueue(c, "big", {"kind": kind}).id for kind in ("result", "error")]
        c.commit()
    worker.start()
    try:
        wait_for(lambda: all(r["status"] == "dead" for r in _rows(db_url, ids).values()), timeout=60)
    finally:
        worker.stop(timeout=5)
    with psycopg.connect(db_url, row_factory=dict_row) as c:
        sizes = c.execute("SELECT id, octet_length(last_error) AS error, octet_length(last_traceback) AS tb, "
                          "result IS NULL AS no_result FROM outboxq_jobs WHERE id = ANY(%s) ORDER BY id",
                          (ids,)).fetchall()
        history = c.execute("SELECT max(octet_length(error)) AS error, max(octet_length(traceback)) AS tb "
                            "FROM outboxq_job_errors WHERE job_id = ANY(%s)", (ids,)).fetchone()
    result_row, error_row = sizes
    assert result_row["no_result"] and result_row["error"] < 1000
    assert 60_000 < error_row["error"] <= 64 * 1024 and error_row["tb"] <= 64 * 1024
    assert history["error"] <= 64 * 1024 and history["tb"] <= 64 * 1024
    assert "more bytes]" in _rows(db_url, [ids[1]])[ids[1]]["last_error"]


def test_the_result_bound_follows_the_setting(db_url):
    worker = Worker([Consumer("sized", lambda payload, ctx: "y" * payload["n"], max_attempts=1)], url=db_url,
                    poll_interval=0.05, run_maintenance=False, settings=Settings(max_result_bytes=4096))
    with psycopg.connect(db_url) as c:
        small, large = (enqueue(c, "sized", {"n": n}).id for n in (4000, 5000))
        c.commit()
    worker.start()
    try:
        wait_for(lambda: all(r["status"] in ("done", "dead") for r in _rows(db_url, [small, large]).values()))
    finally:
        worker.stop(timeout=5)
    rows = _rows(db_url, [small, large])
    assert rows[small]["status"] == "done" and rows[small]["result"] == "y" * 4000
    assert rows[large]["status"] == "dead"
    assert "over the bound of 4096 bytes (OUTBOXQ_MAX_RESULT_BYTES)" in rows[large]["last_error"]


def test_a_progress_message_with_nul_is_stored_escaped(db_url):
    def handler(payload, ctx):
        ctx.set_progress(0.5, "half\x00way \ud800")

    worker = Worker([Consumer("progress", handler)], url=db_url, poll_interval=0.05, run_maintenance=False)
    with psycopg.connect(db_url) as c:
        job_id = enqueue(c, "progress", {}).id
        c.commit()
    worker.start()
    try:
        wait_for(lambda: _rows(db_url, [job_id])[job_id]["status"] == "done")
    finally:
        worker.stop(timeout=5)
    with psycopg.connect(db_url) as c:
        (message,) = c.execute("SELECT progress_message FROM outboxq_jobs WHERE id = %s", (job_id,)).fetchone()
    assert message == "half\\x00way \\ud800"
