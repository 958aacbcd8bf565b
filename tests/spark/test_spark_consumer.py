"""Spark consumers with a real local Spark session and a real PostgreSQL: results, crashes, bad payloads
and the `outboxq spark run` command (HTTP batches: test_spark_batches.py)."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from decimal import Decimal

import psycopg
import pytest

from outboxq import get_job
from outboxq.spark_jobs import delivery, examples
from outboxq.spark_jobs.consumer import processor_id_for
from outboxq.spark_jobs.delivery import (
    STEP_AFTER_COMMIT,
    STEP_AFTER_SNAPSHOT,
    STEP_AFTER_WRITE,
    STEP_DURING_PROCESSING,
)
from outboxq.spark_jobs.processing import SparkEngine, infer_schema, schema_sample
from tests.handlers_runtime import isolated_registry  # noqa: F401 - the report step's consumer is forgotten
from tests.spark_support import (
    Crash,
    crash_at,
    enqueue_orders,
    extra_database,
    order_payloads,
    run_until_empty,
    spark_env,
    statuses,
    table_rows,
)

pytestmark = pytest.mark.spark


def _expected_totals(payloads: list[dict]) -> dict[str, tuple[int, Decimal]]:
    totals: dict[str, list] = defaultdict(lambda: [0, Decimal("0")])
    for p in payloads:
        totals[p["customer"]][0] += 1
        totals[p["customer"]][1] += Decimal(str(p["amount"]))
    return {c: (n, t) for c, (n, t) in totals.items()}


def test_a_spark_batch_writes_the_processors_rows_once_with_the_delivery_hash(db_url, spark):
    payloads = order_payloads(50)
    ids = enqueue_orders(db_url, payloads)

    stats = run_until_empty(db_url, SparkEngine(spark, examples.order_totals), batch_size=100,
                            output_table="order_totals")

    assert stats.batches == 1 and stats.jobs_completed == 50
    rows = table_rows(db_url, "order_totals")
    assert {r[0]: (r[1], r[2]) for r in rows} == _expected_totals(payloads)
    assert {r[3] for r in rows} == {delivery.delivery_hash("totals", ids)}
    assert statuses(db_url) == {"done": 50}


def test_a_bad_cast_in_one_payload_fails_that_job_alone(db_url, spark):
    payloads = order_payloads(20)
    payloads[5] = {"customer": "c0", "amount": "not a number"}
    ids = enqueue_orders(db_url, payloads)

    stats = run_until_empty(db_url, SparkEngine(spark, examples.strict_order_totals), batch_size=20,
                            output_table="strict_totals")

    assert stats.jobs_completed == 19 and stats.jobs_failed == 1
    good = [p for i, p in enumerate(payloads) if i != 5]
    rows = table_rows(db_url, "strict_totals")
    assert {r[0]: round(r[1], 2) for r in rows} == {c: float(t) for c, (_, t) in _expected_totals(good).items()}
    with psycopg.connect(db_url) as conn:
        bad = get_job(conn, ids[5])
    assert bad.status == "retrying" and "CAST_INVALID_INPUT" in bad.last_error


def test_spark_runs_killed_at_each_step_then_rerun_equal_an_uninterrupted_run(db_url, pg_server_url,
                                                                             template_db, spark):
    engine = SparkEngine(spark, examples.order_totals)
    payloads = order_payloads(60)
    with extra_database(pg_server_url, template_db) as reference_url:
        enqueue_orders(reference_url, payloads)
        run_until_empty(reference_url, engine, batch_size=25, output_table="order_totals")
        expected = table_rows(reference_url, "order_totals")
    assert len({r[3] for r in expected}) == 3  # three batches

    for step in (STEP_AFTER_SNAPSHOT, STEP_DURING_PROCESSING, STEP_AFTER_WRITE, STEP_AFTER_COMMIT):
        with extra_database(pg_server_url, template_db) as url:
            enqueue_orders(url, payloads)
            with pytest.raises(Crash):
                run_until_empty(url, engine, batch_size=25, output_table="order_totals",
                                on_step=crash_at(step, nth=2))
            run_until_empty(url, engine, batch_size=25, output_table="order_totals")
            assert table_rows(url, "order_totals") == expected, step
            assert statuses(url) == {"done": 60}, step


def test_the_inferred_schema_reads_every_payload_like_sparks_json_reader(spark):
    records = [{"a": 1, "b": "x", "n": {"k": 1}}, {"a": 2.5, "b": None, "n": {"k": 2, "j": True}, "l": [1, 2]},
               {"a": 3, "b": 7, "l": []}]
    schema = infer_schema(records)
    assert schema.simpleString() == "struct<a:double,b:string,l:array<bigint>,n:struct<j:boolean,k:bigint>>"


def test_the_spark_run_command_killed_after_the_write_then_rerun_delivers_once(db_url):
    payloads = order_payloads(40)
    ids = enqueue_orders(db_url, payloads)
    command = [sys.executable, "-m", "outboxq.cli", "spark", "run", "--queue", "orders-in",
               "--processor", "outboxq.spark_jobs.examples:order_totals", "--output-table", "order_totals",
               "--batch-size", "100", "--until-empty", "--json"]

    crashed = subprocess.run(command, env=spark_env(db_url, OUTBOXQ_SPARK_CRASH_AT="after_write"),
                             capture_output=True, text=True, timeout=300)
    assert crashed.returncode == 70, crashed.stderr[-2000:]
    assert statuses(db_url) == {"running": 40}

    rerun = subprocess.run(command, env=spark_env(db_url), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert '"recovered": 1' in rerun.stdout
    rows = table_rows(db_url, "order_totals")
    assert {r[0]: (r[1], r[2]) for r in rows} == _expected_totals(payloads)
    processor_id = processor_id_for("orders-in", "outboxq.spark_jobs.examples:order_totals", "order_totals")
    assert {r[3] for r in rows} == {delivery.delivery_hash(processor_id, ids)}
    assert statuses(db_url) == {"done": 40}


def test_a_processor_with_a_declared_payload_schema_reads_the_payloads_with_it(db_url, spark):
    def amounts(jobs):
        return jobs.select("job_id", "customer", "amount")

    amounts.payload_schema = "customer string, amount decimal(10,2)"
    payloads = [{"customer": f"c{i}", "amount": f"{i}.25", "note": "not read"} for i in range(10)]
    ids = enqueue_orders(db_url, payloads)

    run_until_empty(db_url, SparkEngine(spark, amounts), batch_size=10, output_table="amounts")

    rows = table_rows(db_url, "amounts")
    assert sorted((r[0], r[1], r[2]) for r in rows) == [(ids[i], f"c{i}", Decimal(f"{i}.25")) for i in range(10)]


def test_the_schema_sample_is_spread_over_the_batch_and_the_same_for_the_same_jobs():
    lines = [str(i) for i in range(10_000)]
    sample = schema_sample(lines, 100)
    assert len(sample) == 101 and sample[0] == "0" and sample[-1] == "9999" and sample[50] == "5000"
    assert schema_sample(lines, 100) == sample
    assert schema_sample(lines, 0) == lines and schema_sample(lines[:50], 100) == lines[:50]


def test_a_spark_batch_is_a_workflow_step_whose_summary_the_next_step_receives(db_url, spark):
    from outboxq import Workflow, get_workflow
    from outboxq.testing import TestQueue
    from outboxq.workers.registry import Consumer, register
    from tests.spark_support import QUEUE

    payloads = order_payloads(4)
    wf = Workflow("nightly")
    orders = [wf.step(f"order-{i}", queue=QUEUE, payload=p) for i, p in enumerate(payloads)]
    wf.step("report", queue="report", after=orders)
    with psycopg.connect(db_url) as conn:
        workflow_id = wf.enqueue(conn)
        conn.commit()
    stats = run_until_empty(db_url, SparkEngine(spark, examples.order_totals), batch_size=100,
                            output_table="order_totals")
    assert stats.jobs_completed == 4
    seen = []
    register(Consumer("report", lambda payload, ctx: seen.append(ctx.parent_results)))
    TestQueue(db_url).run_one("report")
    [parents] = seen
    assert set(parents) == {f"order-{i}" for i in range(4)}
    summaries = list(parents.values())
    assert all(s == summaries[0] for s in summaries)  # one batch: one summary for each of its jobs
    assert summaries[0]["jobs"] == 4 and summaries[0]["rows_written"] == len(table_rows(db_url, "order_totals"))
    assert summaries[0]["output_table"].endswith(".order_totals") and len(summaries[0]["delivery_hash"]) == 64
    with psycopg.connect(db_url) as conn:
        assert get_workflow(conn, workflow_id).status == "done"
