"""Spark consumers of outboxq queues with exactly-once effects (delivery hashes in the same database), and
outboxq as a Spark data source and sink (``register(spark)``, then ``format("outboxq")``)."""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Make format("outboxq") (batch and streaming source, streaming sink) known to a SparkSession."""
    from outboxq.spark_jobs.datasource import register as register_format

    register_format(spark)
