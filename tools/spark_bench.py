"""`python -m tools spark-bench`: rows/s of claim → process → deliver, Spark (warm session) against plain Python,
and the same jobs through a streaming query on format("outboxq") (source and sink).

Both paths run the same consumer (claim with a snapshot, one-transaction delivery with the delivery hash);
only the engine differs: Spark's DataFrame processor, or the same computation in plain Python on the driver.
Spark's session start-up is measured on its own; WARM_UP_BATCHES untimed batches of the measured size warm
each engine before the timed rounds: the JVM compiles Spark's code paths during its first large batches, and
after the first one its JIT compiler threads still took 0.3 s of CPU during the next batch's delivery (on 2
cores, beside PostgreSQL's work), none after the second. Each round's
time is split into the consumer's steps: claim, process (the engine), deliver.
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from typing import Any

from psycopg import sql as pgsql

from outboxq import enqueue_many
from outboxq.db import connect, database_url
from outboxq.queue.sql import spark as spark_sql
from outboxq.settings import get_settings
from outboxq.spark_jobs import examples
from outboxq.spark_jobs import register as register_format
from outboxq.spark_jobs.consumer import Consumer, ConsumerConfig
from outboxq.spark_jobs.processing import BatchEngine, PythonEngine, SparkEngine
from outboxq.spark_jobs.session import build_session

QUEUE = "outboxq-spark-bench"
WARM_UP_BATCHES = 2
ENQUEUE_CHUNK = 10_000


def _enqueue(url: str, jobs: int) -> None:
    rng = random.Random(7)
    with connect(url) as conn:
        for start in range(0, jobs, ENQUEUE_CHUNK):
            payloads = [{"customer": f"c{rng.randrange(1000)}", "amount": round(rng.random() * 100, 2),
                         "quantity": rng.randrange(1, 5)} for _ in range(min(ENQUEUE_CHUNK, jobs - start))]
            enqueue_many(conn, QUEUE, payloads)
        conn.commit()


def _reset(url: str, table: str) -> None:
    with connect(url, autocommit=True) as conn:
        conn.execute(pgsql.SQL(spark_sql.spark_bench_drop_output).format(
            table=pgsql.Identifier(get_settings().spark_results_schema, table)))
        conn.execute(spark_sql.spark_bench_delete_jobs, {"queue": QUEUE})
        conn.execute(spark_sql.spark_bench_vacuum_jobs)


def _timed_drain(url: str, engine: BatchEngine, name: str, jobs: int, batch_size: int) -> dict[str, Any]:
    table = f"spark_bench_{name}"
    _reset(url, table)
    _enqueue(url, jobs)
    config = ConsumerConfig.from_settings(queue=QUEUE, processor=f"bench:{name}", output_table=table,
                                          batch_size=batch_size)
    started = time.perf_counter()
    with Consumer(url, engine, config) as consumer:
        stats = consumer.run(until_empty=True)
    seconds = time.perf_counter() - started
    if stats.jobs_completed != jobs or stats.rows_written != jobs:
        raise RuntimeError(f"{name}: {stats.jobs_completed} jobs done, {stats.rows_written} rows, of {jobs}")
    return {"seconds": seconds, "rows_per_s": jobs / seconds, "steps_s": dict(stats.seconds)}


def _database_counters(url: str) -> dict[str, float]:
    # PostgreSQL publishes a backend's counters when it goes idle (at most once a second): wait for them.
    time.sleep(1.5)
    with connect(url) as conn:
        return dict(conn.execute(spark_sql.spark_bench_database_counters).fetchone())


def _timed_stream(url: str, spark: Any, jobs: int, batch_size: int, checkpoint: str) -> dict[str, Any]:
    """The same jobs and computation as order_lines through a streaming query: format("outboxq") in and out,
    Trigger.AvailableNow, batch_size jobs a micro-batch."""
    from pyspark.sql import functions as F

    table = "spark_bench_stream"
    _reset(url, table)
    _enqueue(url, jobs)
    before = _database_counters(url)
    order = F.from_json("payload", "customer STRING, amount DOUBLE, quantity BIGINT")
    started = time.perf_counter()
    query = (spark.readStream.format("outboxq").option("url", url).option("queue", QUEUE).option("name", "bench")
             .option("maxJobsPerTrigger", batch_size).load()
             .select("job_id", "delivery_hash", order.alias("o"))
             .select("job_id", "delivery_hash", F.col("o.customer").alias("customer"),
                     (F.col("o.amount") * F.coalesce(F.col("o.quantity"), F.lit(1))).alias("line_total"))
             .writeStream.format("outboxq").option("url", url).option("table", table)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.perf_counter() - started
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    after = _database_counters(url)
    with connect(url) as conn:
        written = conn.execute(pgsql.SQL("SELECT count(*) AS n FROM {}").format(
            pgsql.Identifier(get_settings().spark_results_schema, table))).fetchone()["n"]
    if written != jobs or sum(p["numInputRows"] for p in progress) != jobs:
        raise RuntimeError(f"stream: {written} rows written of {jobs}")
    micro_batches = max(1, len(progress))
    per_batch = {name: (after[name] - before[name]) / micro_batches for name in after}
    steps = {step: statistics.median(p["durationMs"].get(step, 0) for p in progress) / 1000
             for step in ("latestOffset", "addBatch", "commitOffsets", "walCommit")}
    triggers_s = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
    return {"seconds": seconds, "rows_per_s": jobs / seconds, "steps_s": steps, "micro_batches": micro_batches,
            "in_micro_batches_rows_per_s": jobs / triggers_s if triggers_s else 0.0,
            "database_per_micro_batch": per_batch}


def run_bench(*, jobs: int, batch_size: int, rounds: int, master: str, stream: bool = True) -> dict[str, Any]:
    """Run the rounds (Spark, plain and, with stream, a streaming query, alternating) and return the figures plus
    a printable table."""
    url = database_url()
    started = time.perf_counter()
    spark = build_session(master)
    session_start_s = time.perf_counter() - started
    engines: dict[str, BatchEngine] = {
        "spark": SparkEngine(spark, examples.order_lines, schema_sample=get_settings().spark_schema_sample),
        "plain": PythonEngine(examples.plain_order_lines),
    }
    register_format(spark)
    checkpoints = tempfile.mkdtemp(prefix="outboxq-spark-bench-")
    try:
        warm_up_s = {name: [_timed_drain(url, engine, name, min(jobs, batch_size), batch_size)["seconds"]
                            for _ in range(WARM_UP_BATCHES)]
                     for name, engine in engines.items()}
        if stream:
            warm_up_s["stream"] = [_timed_stream(url, spark, min(jobs, batch_size), batch_size,
                                                 f"{checkpoints}/warm-{n}")["seconds"] for n in range(WARM_UP_BATCHES)]
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in [*engines, *(["stream"] if stream else [])]}
        for n in range(rounds):
            for name, engine in engines.items():
                runs[name].append(_timed_drain(url, engine, name, jobs, batch_size))
            if stream:
                runs["stream"].append(_timed_stream(url, spark, jobs, batch_size, f"{checkpoints}/round-{n}"))
    finally:
        spark.stop()
        shutil.rmtree(checkpoints, ignore_errors=True)
        for name in [*engines, "stream"]:
            _reset(url, f"spark_bench_{name}")
    medians = {name: statistics.median(r["rows_per_s"] for r in rs) for name, rs in runs.items()}
    lines = [
        f"spark-bench: {jobs} jobs per round, batches of {batch_size}, {rounds} rounds, master {master}",
        f"  Spark session start: {session_start_s:.1f} s; warm-up batches: "
        + "; ".join(f"{name} {', '.join(f'{s:.1f}' for s in times)} s" for name, times in warm_up_s.items()),
    ]
    for name, rs in runs.items():
        each = ", ".join(f"{r['rows_per_s']:,.0f}" for r in rs)
        lines.append(f"  {name:5}  median {medians[name]:>9,.0f} rows/s   (rounds: {each})")
    for name, rs in runs.items():
        steps = ", ".join(f"{step} {statistics.median(r['steps_s'][step] for r in rs):.2f} s"
                          for step in rs[0]["steps_s"])
        lines.append(f"  {name:5}  median per round: {steps}")
    lines.append(f"  Spark / plain: {medians['spark'] / medians['plain']:.2f}")
    if stream:
        lines += _stream_lines(runs["stream"], medians)
    return {"jobs": jobs, "batch_size": batch_size, "rounds": rounds, "master": master,
            "session_start_s": session_start_s, "warm_up_s": warm_up_s, "runs": runs,
            "median_rows_per_s": medians, "table": "\n".join(lines)}


def _stream_lines(stream_runs: list[dict[str, Any]], medians: dict[str, float]) -> list[str]:
    cost = {name: statistics.median(r["database_per_micro_batch"][name] for r in stream_runs)
            for name in stream_runs[0]["database_per_micro_batch"]}
    return [
        "  stream: without the query's start, in its micro-batches: median "
        f"{statistics.median(r['in_micro_batches_rows_per_s'] for r in stream_runs):,.0f} rows/s",
        f"  stream: median {statistics.median(r['micro_batches'] for r in stream_runs)} micro-batches a round; "
        "database per micro-batch: " + ", ".join(f"{name} {value:,.0f}" for name, value in cost.items()),
        f"  stream / spark (outboxq spark run): {medians['stream'] / medians['spark']:.2f}",
    ]


def cmd_spark_bench(args: Any) -> int:
    """Claim → process → deliver N small jobs with Spark (warm session) and with the plain worker path."""
    import json

    results = run_bench(jobs=args.jobs, batch_size=args.batch_size, rounds=args.rounds, master=args.master,
                        stream=args.stream)
    print(json.dumps(results, indent=2) if args.json else results["table"])
    return 0


def register(sub: Any) -> None:
    """Add `python -m tools spark-bench` (what was `outboxq spark bench`) to the tools' command."""
    p = sub.add_parser("spark-bench", help="rows/s of Spark batches against the plain worker path")
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=5, help="alternated rounds; figures are medians (default 5)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--no-stream", dest="stream", action="store_false",
                   help="leave out the streaming query (format outboxq in and out)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_spark_bench)
