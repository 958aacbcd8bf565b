"""format("outboxq") with a real local Spark (local[2]) and a real PostgreSQL: batch reads, streaming queries
through the sink (killed and restarted, side by side, with poison and filtered rows), the enqueue sink, and
a micro-batch written twice. The standalone cluster's case is in test_spark_cluster.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from decimal import Decimal

import psycopg
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import Row
from pyspark.sql import functions as F

from outboxq import JobStatus, enqueue_many, get_job
from outboxq.db import connect
from outboxq.errors import InvalidInput
from outboxq.spark_jobs import delivery
from outboxq.spark_jobs.datasource import SourceOptions, StreamReader
from outboxq.spark_jobs.sink import write_partition
from tests.api_support import api_client, auth
from tests.spark_stream_driver import orders_stream
from tests.spark_support import RESULTS, enqueue_orders, order_payloads, statuses, table_rows
from tests.support import wait_for

pytestmark = pytest.mark.spark


def _totals(payloads) -> tuple[int, Decimal]:
    return len(payloads), sum((Decimal(str(p["amount"])) for p in payloads), Decimal("0"))


def _table_totals(url: str, table: str) -> tuple[int, int, Decimal]:
    with psycopg.connect(url) as conn:
        row = conn.execute(f'SELECT count(*), count(DISTINCT job_id), coalesce(sum(amount), 0) FROM "{RESULTS}"."{table}"').fetchone()
    return int(row[0]), int(row[1]), row[2]


def test_a_batch_read_gives_every_job_with_its_columns_and_runs_filters_in_postgres(db_url, spark):
    payloads = order_payloads(500)
    ids = enqueue_orders(db_url, payloads, queue="ds-read")
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE outboxq_jobs SET status = 'done', finished_at = now(), result = '{\"ok\": 1}' "
                     "WHERE id = ANY(%s)", (ids[:100],))
        conn.commit()
    jobs = spark.read.format("outboxq").option("url", db_url).option("queue", "ds-read").option("numPartitions", 4).load()

    assert jobs.rdd.getNumPartitions() == 4
    assert jobs.columns == ["job_id", "queue", "key", "status", "payload", "attempts", "created_at", "finished_at",
                            "result", "last_error", "delivery_hash"]
    amounts = jobs.select(F.from_json("payload", "amount DECIMAL(14,2)").amount.alias("amount"))
    assert amounts.agg(F.count("*"), F.sum("amount")).first() == (500, _totals(payloads)[1])
    assert sorted(r.job_id for r in jobs.select("job_id").collect()) == ids

    done = jobs.filter((F.col("status") == "done") & (F.col("job_id") > ids[9]))
    assert done.count() == 90 and {r.result for r in done.select("result").collect()} == {'{"ok": 1}'}
    # the status and id filters ran in PostgreSQL: Spark's own Filter only checks for NULLs
    plan = done._jdf.queryExecution().executedPlan().toString()
    filter_lines = [line for line in plan.splitlines() if "Filter" in line]
    assert filter_lines and all("= done" not in line and "> " not in line for line in filter_lines), plan
    recent = jobs.filter(F.col("created_at") >= F.lit("2000-01-01").cast("timestamp"))
    assert recent.count() == 500 and jobs.filter("finished_at < '2000-01-01'").count() == 0
    assert statuses(db_url, "ds-read") == {"done": 100, "queued": 400}  # a read claims nothing


def test_wrong_options_are_refused_with_what_to_give_instead(db_url, spark, tmp_path):
    with pytest.raises(InvalidInput, match="option maxJobsPerTrigger: Input should be greater than or equal to 1"):
        SourceOptions.parse({"url": db_url, "queue": "q", "maxJobsPerTrigger": "0"})
    with pytest.raises(InvalidInput, match="'maxjobpertrigger' is not an option of this format"):
        SourceOptions.parse({"url": db_url, "queue": "q", "maxJobPerTrigger": "10"})
    with pytest.raises(InvalidInput, match="either 'table' or 'enqueueQueue'"):
        SourceOptions.parse({"url": db_url, "table": "t", "enqueueQueue": "q"})
    with pytest.raises(PySparkException, match="option queue is required"):
        spark.read.format("outboxq").option("url", db_url).load().count()
    with pytest.raises(PySparkException, match="option table: String should match pattern"):
        spark.read.format("outboxq").option("url", db_url).option("queue", "q").option("table", "no; drop").load().count()
    stream = spark.readStream.format("outboxq").option("url", db_url).option("queue", "ds-opts").load()
    with pytest.raises(PySparkException, match="the rows need the source's column 'job_id'"):
        query = (stream.select("payload", "delivery_hash").writeStream.format("outboxq").option("url", db_url)
                 .option("table", "t").option("checkpointLocation", str(tmp_path)).trigger(availableNow=True).start())
        query.awaitTermination(60)
    with pytest.raises(PySparkException, match="the sink is for streaming queries"):
        spark.createDataFrame([(1,)], "job_id LONG").write.format("outboxq").option("url", db_url).option("table", "t").mode("append").save()


def _driver(db_url: str, checkpoint, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tests.spark_stream_driver", db_url, str(checkpoint), "--queue", "ds-orders",
            "--table", "ds_totals", *extra]


def test_a_stream_killed_by_sigkill_and_restarted_on_its_checkpoint_writes_every_job_once(db_url, tmp_path):
    payloads = order_payloads(1200)
    enqueue_orders(db_url, payloads, queue="ds-orders")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    first = subprocess.Popen(_driver(db_url, tmp_path / "checkpoint", "--max-jobs", "300"), env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: statuses(db_url, "ds-orders").get("done", 0) >= 300, timeout=180, interval=0.1)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers, mid-stream
        first.wait(timeout=30)
    assert statuses(db_url, "ds-orders").get("done", 0) < 1200  # it died with work left

    second = subprocess.run(_driver(db_url, tmp_path / "checkpoint", "--max-jobs", "300", "--available-now"), env=env,
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-4000:]

    assert statuses(db_url, "ds-orders") == {"done": 1200}
    rows, distinct_jobs, total = _table_totals(db_url, "ds_totals")
    assert (rows, distinct_jobs, total) == (1200, 1200, _totals(payloads)[1])
    with psycopg.connect(db_url) as conn:
        hashes = conn.execute(f'SELECT count(DISTINCT delivery_hash) FROM "{RESULTS}".ds_totals').fetchone()[0]
        claimed = conn.execute("SELECT count(*) FROM outboxq_spark_snapshots WHERE state = 'claimed'").fetchone()[0]
    assert hashes >= 4 and claimed == 0  # 300 jobs a micro-batch, each settled


def test_two_queries_on_one_queue_share_it_without_a_job_in_both(db_url, spark, tmp_path):
    payloads = order_payloads(1000)
    enqueue_orders(db_url, payloads, queue="ds-shared")
    queries = [orders_stream(spark, db_url, "ds-shared", name=name, max_jobs=100).writeStream.format("outboxq")
               .option("url", db_url).option("table", f"ds_shared_{name}")
               .option("checkpointLocation", str(tmp_path / name)).trigger(processingTime="50 milliseconds").start()
               for name in ("left", "right")]
    try:
        wait_for(lambda: statuses(db_url, "ds-shared") == {"done": 1000}, timeout=180, interval=0.2)
        with api_client(db_url, scope=None) as api:  # what operators see while they run: the route and metrics
            listed = api.get("/v1/spark/streams", headers=auth("read")).json()["items"]
            metrics = api.get("/metrics", headers=auth("read")).text
    finally:
        for query in queries:
            query.stop()
    left = {row[0] for row in table_rows(db_url, "ds_shared_left")}
    right = {row[0] for row in table_rows(db_url, "ds_shared_right")}
    assert left and right and not left & right and len(left | right) == 1000
    with psycopg.connect(db_url) as conn:
        streams = conn.execute("SELECT name, application_id, jobs_read FROM outboxq_spark_streams ORDER BY name").fetchall()
    assert [(name, app) for name, app, _ in streams] == [("left", spark.sparkContext.applicationId),
                                                         ("right", spark.sparkContext.applicationId)]
    assert sum(jobs for _, _, jobs in streams) == 1000
    assert {(s["name"], s["queue"], s["application_id"], s["running"], s["lag"]) for s in listed} == {
        (name, "ds-shared", spark.sparkContext.applicationId, True, 0) for name in ("left", "right")}
    read = [float(line.split()[-1]) for line in metrics.splitlines()
            if line.startswith("outboxq_spark_stream_jobs_read_total{")]
    assert sum(read) == 1000 and 'outboxq_spark_stream_running{queue="ds-shared",stream="right"} 1.0' in metrics


def test_a_poison_payload_fails_alone_and_filtered_out_jobs_are_done(db_url, spark, tmp_path):
    payloads = order_payloads(60)
    ids = enqueue_orders(db_url, payloads, queue="ds-poison")
    with psycopg.connect(db_url) as conn:
        poison = enqueue_many(conn, "ds-poison", [{"customer": "c1", "note": "no amount"}] * 2)
        conn.commit()
    kept = orders_stream(spark, db_url, "ds-poison", max_jobs=25).filter(F.col("customer") != "c4")
    query = (kept.writeStream.format("outboxq").option("url", db_url).option("table", "ds_poison")
             .option("checkpointLocation", str(tmp_path / "poison")).trigger(availableNow=True).start())
    query.awaitTermination(120)

    filtered = [i for i, p in zip(ids, payloads, strict=True) if p["customer"] == "c4"]
    with psycopg.connect(db_url) as conn:
        for job in poison:
            failed = get_job(conn, job.id)
            assert failed.status is JobStatus.RETRYING and failed.last_error.startswith("bad payload: no amount")
        assert all(get_job(conn, i).status is JobStatus.DONE for i in ids)
        assert get_job(conn, filtered[0]).result["written"] is False
    written = [p for p in payloads if p["customer"] != "c4"]
    assert _table_totals(db_url, "ds_poison") == (len(written), len(written), _totals(written)[1])


def test_the_enqueue_sink_turns_each_row_into_one_job_of_another_queue(db_url, spark, tmp_path):
    payloads = order_payloads(120)
    enqueue_orders(db_url, payloads, queue="ds-feed")
    stream = orders_stream(spark, db_url, "ds-feed", max_jobs=40).drop("_error")
    query = (stream.writeStream.format("outboxq").option("url", db_url).option("enqueueQueue", "ds-next")
             .option("checkpointLocation", str(tmp_path / "feed")).trigger(availableNow=True).start())
    query.awaitTermination(120)

    assert statuses(db_url, "ds-feed") == {"done": 120}
    with psycopg.connect(db_url) as conn:
        fed = [r[0] for r in conn.execute("SELECT payload FROM outboxq_jobs WHERE queue = 'ds-next' ORDER BY id")]
    assert len(fed) == 120 and set(fed[0]) == {"customer", "amount"}
    assert sum(Decimal(str(p["amount"])) for p in fed) == _totals(payloads)[1]


def _claimed_rows(db_url: str, queue: str, name: str) -> tuple[StreamReader, list[Row]]:
    """A stream reader's first micro-batch, as the rows the sink would get (no Spark needed)."""
    reader = StreamReader(SourceOptions.parse({"url": db_url, "queue": queue, "name": name}))
    end = reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())
    rows = []
    for partition in reader.partitions(reader.initialOffset(), end):
        for job in reader.read(partition):
            amount = json.loads(job[4])["amount"]
            rows.append(Row(job_id=job[0], delivery_hash=job[10], amount=Decimal(str(amount))))
    return reader, rows


@pytest.mark.parametrize("target", [{"table": "ds_twice"}, {"enqueueQueue": "ds-twice-next"}])
def test_a_micro_batch_written_twice_writes_nothing_twice_and_completes_nothing_twice(db_url, target):
    enqueue_orders(db_url, order_payloads(30), queue="ds-twice")
    reader, rows = _claimed_rows(db_url, "ds-twice", "twice")
    options = SourceOptions.parse({"url": db_url, **target})
    columns = [("job_id", "bigint"), ("amount", "numeric(14,2)")]
    try:
        with connect(db_url) as conn, conn.transaction():
            first = write_partition(conn, rows, options, columns)
        with connect(db_url) as conn, conn.transaction():
            again = write_partition(conn, rows, options, columns)  # the replay of the same micro-batch
    finally:
        reader.stop()
    assert (first.rows_written, first.jobs_completed) == (30, 30)
    assert (again.rows_written, again.jobs_completed, again.rows_skipped) == (0, 0, 30)
    with psycopg.connect(db_url) as conn:
        finished = conn.execute("SELECT count(*), count(DISTINCT finished_at) FROM outboxq_jobs "
                                "WHERE queue = 'ds-twice' AND status = 'done'").fetchone()
        if "table" in target:
            written = conn.execute(f'SELECT count(*) FROM "{RESULTS}".ds_twice').fetchone()[0]
        else:
            written = conn.execute("SELECT count(*) FROM outboxq_jobs WHERE queue = 'ds-twice-next'").fetchone()[0]
    assert finished[0] == 30 and written == 30


def test_a_query_of_the_same_name_fences_the_one_it_replaces(db_url):
    enqueue_orders(db_url, order_payloads(20), queue="ds-fence")
    old, _ = _claimed_rows(db_url, "ds-fence", "fenced")
    new = StreamReader(SourceOptions.parse({"url": db_url, "queue": "ds-fence", "name": "fenced"}))
    try:
        new.initialOffset()  # took over the old one's snapshot at once
        with pytest.raises(delivery.DriverReplaced):
            old.latestOffset({"snapshot": 10**9}, old.getDefaultReadLimit())
        with pytest.raises(delivery.DriverReplaced):
            old.commit({"snapshot": 10**9})
        assert statuses(db_url, "ds-fence") == {"running": 20}  # the new query's now: nothing settled by the old
    finally:
        old.stop()
        new.stop()


def test_the_spark_bench_stream_round_drains_its_jobs_and_measures_each_micro_batch(db_url, spark, tmp_path,
                                                                                    monkeypatch):
    """tools/spark_bench.py's streaming round (what `python -m tools spark-bench` prints beside spark run)."""
    from tools import spark_bench

    monkeypatch.setenv("DATABASE_URL", db_url)
    result = spark_bench._timed_stream(db_url, spark, 200, 100, str(tmp_path / "bench"))
    assert result["micro_batches"] == 2 and result["rows_per_s"] > 0 and result["in_micro_batches_rows_per_s"] > 0
    assert result["database_per_micro_batch"]["transactions"] > 0
    assert set(result["steps_s"]) == {"latestOffset", "addBatch", "commitOffsets", "walCommit"}
    lines = spark_bench._stream_lines([result], {"stream": result["rows_per_s"], "spark": result["rows_per_s"]})
    assert lines[-1] == "  stream / spark (outboxq spark run): 1.00"
