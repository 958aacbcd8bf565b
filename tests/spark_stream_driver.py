"""A Spark driver of the data source tests: streams a queue's order jobs through format("outboxq") into a table.

    python -m tests.spark_stream_driver URL CHECKPOINT --queue Q --table T [--master M] [--available-now]

Each row is (job_id, delivery_hash, customer, amount); a payload without an amount gets an error instead
(the sink fails that job alone). Without --available-now it runs until killed; with it, until the queue's
jobs of when it started are done. Prints one JSON line of the query's progress at the end.
"""

from __future__ import annotations

import argparse
import json
import sys

from pyspark.sql import functions as F

from outboxq.spark_jobs import register
from outboxq.spark_jobs.session import build_session

ORDER = "customer STRING, amount DECIMAL(14,2)"


def orders_stream(spark, url: str, queue: str, *, name: str | None = None, max_jobs: int = 200):
    """The queue's jobs as (job_id, delivery_hash, customer, amount, _error) rows."""
    reader = (spark.readStream.format("outboxq").option("url", url).option("queue", queue)
              .option("maxJobsPerTrigger", max_jobs))
    if name:
        reader = reader.option("name", name)
    order = F.from_json("payload", ORDER)
    return (reader.load().withColumn("order", order)
            .select("job_id", "delivery_hash", F.col("order.customer").alias("customer"),
                    F.col("order.amount").alias("amount"),
                    F.when(F.col("order.amount").isNull(), F.concat(F.lit("bad payload: no amount in "),
                                                                     F.col("payload"))).alias("_error")))


def main(argv: list[str] | None = None) -> int:
    """Run the query (see the module's docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("checkpoint")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--max-jobs", type=int, default=200)
    parser.add_argument("--available-now", action="store_true")
    args = parser.parse_args(argv)
    spark = build_session(args.master, shuffle_partitions=2)
    register(spark)
    writer = (orders_stream(spark, args.url, args.queue, max_jobs=args.max_jobs).writeStream.format("outboxq")
              .option("url", args.url).option("table", args.table).option("checkpointLocation", args.checkpoint))
    writer = writer.trigger(availableNow=True) if args.available_now else writer.trigger(processingTime="100 milliseconds")
    query = writer.start()
    query.awaitTermination()
    print(json.dumps({"batches": len(query.recentProgress),
                      "rows": sum(p["numInputRows"] for p in query.recentProgress)}))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
