"""Example processors: plain functions from a DataFrame of job payloads to a DataFrame of result rows.

The jobs DataFrame has the payload's fields plus job_id and queue. Parse values with try_cast (Spark 4 is
ANSI: a plain cast of one bad value aborts the whole batch) or check them, as these examples do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def order_totals(jobs: DataFrame) -> DataFrame:
    """One row per customer: the number of orders and their total amount (payload: customer, amount)."""
    from pyspark.sql import functions as F

    return jobs.groupBy("customer").agg(
        F.count("*").alias("orders"),
        F.sum(F.col("amount").try_cast("decimal(14,2)")).alias("total"),
    )


def order_lines(jobs: DataFrame) -> DataFrame:
    """One row per job: its customer and amount × quantity (payload: customer, amount, quantity)."""
    from pyspark.sql import functions as F

    amount = F.col("amount").try_cast("double")
    quantity = F.coalesce(F.col("quantity").try_cast("bigint"), F.lit(1))
    return jobs.select(F.col("job_id"), F.col("customer"), (amount * quantity).alias("line_total"))


def strict_order_totals(jobs: DataFrame) -> DataFrame:
    """Like order_totals, but a payload whose amount is not a number raises (an ANSI cast error)."""
    from pyspark.sql import functions as F

    return jobs.groupBy("customer").agg(F.sum(F.col("amount").cast("double")).alias("total"))


def plain_order_lines(records: list[dict]) -> list[dict]:
    """order_lines for the plain-Python engine (the worker path the Spark path is benchmarked against)."""
    rows = []
    for record in records:
        amount = _number(record.get("amount"), float)
        quantity = _number(record.get("quantity"), int)
        rows.append({"job_id": record["job_id"], "customer": record.get("customer"),
                     "line_total": None if amount is None else amount * (1 if quantity is None else quantity)})
    return rows


def _number(value, kind):
    try:
        return None if value is None else kind(value)
    except (TypeError, ValueError):
        return None
