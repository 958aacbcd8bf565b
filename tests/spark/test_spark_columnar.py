"""A Spark batch kept in Arrow columns (spark_jobs.columnar) gives exactly what the row path gives:
payloads read by Arrow's JSON reader equal Spark's from_json, and results copied as CSV equal the rows
copied one by one."""

from __future__ import annotations

import json
import math
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import pyarrow
import pytest

from outboxq.spark_jobs import columnar
from outboxq.spark_jobs.delivery import SnapshotJob
from outboxq.spark_jobs.processing import BatchResult, SparkEngine, with_job_fields
from tests.spark_support import enqueue_orders, order_payloads, run_until_empty, table_rows

pytestmark = pytest.mark.spark


def _jobs(payloads: list[dict[str, Any]]) -> list[SnapshotJob]:
    return [SnapshotJob(i, "q", 1, None, json.dumps({**p, "job_id": i, "queue": "q"}))
            for i, p in enumerate(payloads, start=1)]


def _from_json_rows(spark, jobs: list[SnapshotJob], schema) -> list:
    from pyspark.sql import functions as F

    raw = spark.createDataFrame(pyarrow.table({"value": [j.row_json for j in jobs]}))
    return raw.select(F.from_json("value", schema).alias("row")).select("row.*").collect()


def test_payloads_arrow_reads_become_the_same_rows_as_sparks_from_json(spark):
    jobs = _jobs([{"a": 1.5, "s": "x", "n": 3, "st": {"k": 1, "extra": "ignored"}, "l": [1, None, 2]},
                  {"a": 2, "s": "é \" \\ \n", "n": None, "l": []}, {"b": True}])
    engine = SparkEngine(spark, lambda frame: frame)
    schema = with_job_fields("a double, s string, n bigint, st struct<k:bigint>, l array<bigint>, b boolean")

    assert columnar.payload_table([j.row_json for j in jobs], schema) is not None
    engine.declared_schema = "a double, s string, n bigint, st struct<k:bigint>, l array<bigint>, b boolean"
    frame = engine.jobs_frame(jobs)
    assert frame.schema == schema
    assert frame.collect() == _from_json_rows(spark, jobs, schema)


@pytest.mark.parametrize("payload", ['{"a": "1.5"}', '{"s": 7}', '{"s": {"k": 1}}', '{"n": 1.5}',
                                     '{"n": 1180591620717411303424}', '{"a": 1e400}', '{"l": "x"}'])
def test_a_payload_arrow_cannot_read_as_spark_would_is_read_by_spark(spark, payload):
    jobs = _jobs([{"a": 1.0, "s": "ok", "n": 1, "l": [1]}])
    jobs.append(SnapshotJob(2, "q", 1, None, payload))  # (as PostgreSQL's jsonb gives it: 1e400 is no float)
    schema = with_job_fields("a double, s string, n bigint, l array<bigint>")

    assert columnar.payload_table([j.row_json for j in jobs], schema) is None
    engine = SparkEngine(spark, lambda frame: frame)
    engine.declared_schema = "a double, s string, n bigint, l array<bigint>"
    assert engine.jobs_frame(jobs).collect() == _from_json_rows(spark, jobs, schema)


def test_schemas_with_types_of_sparks_own_rules_are_left_to_spark():
    from pyspark.sql import types as T

    assert columnar.arrow_readable(with_job_fields("a double, l array<struct<s:string,b:boolean>>"))
    for ddl in ("d decimal(10,2)", "t timestamp", "d date", "m map<string,bigint>", "b binary", "f float"):
        assert not columnar.arrow_readable(T._parse_datatype_string(ddl)), ddl


COLUMNS = [("s", "text"), ("f", "double precision"), ("r", "real"), ("n", "bigint"), ("b", "boolean"),
           ("m", "numeric(10,2)"), ("d", "date"), ("t", "timestamptz"), ("u", "timestamp")]


def _result_table() -> pyarrow.Table:
    moment = datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=timezone.utc)
    return pyarrow.table({
        "s": ['a "quoted", value', "", None, "line\nbreak\r", "\\N", "é,\\", "\t"],
        "f": [0.1 + 0.2, math.nan, math.inf, -math.inf, 5e-324, None, -0.0],
        "r": pyarrow.array([1.1, 3.4028234663852886e38, None, 0.0, 1e-45, 2.5, -7.0], pyarrow.float32()),
        "n": [2**63 - 1, -(2**63), None, 0, 1, 2, 3],
        "b": [True, False, None, True, False, True, False],
        "m": pyarrow.array([Decimal("12345678.91"), Decimal("-0.01"), None, Decimal("0.00"), Decimal("1.50"),
                            Decimal("2"), Decimal("3")], pyarrow.decimal128(10, 2)),
        "d": [date(1, 1, 1), date(9999, 12, 31), None, date(2024, 2, 29), date(1970, 1, 1), date(2000, 1, 1),
              date(2000, 1, 2)],
        "t": pyarrow.array([moment, datetime(1, 1, 1, tzinfo=timezone.utc), None, moment, moment, moment,
                            moment], pyarrow.timestamp("us", tz="UTC")),
        "u": pyarrow.array([moment.replace(tzinfo=None)] * 6 + [None], pyarrow.timestamp("us")),
    })


class _TableEngine:
    """An engine whose result is a fixed Arrow table, given as the table or as its rows."""

    def __init__(self, as_rows: bool) -> None:
        self.as_rows = as_rows

    def process(self, jobs, delivery_hash):
        table = _result_table()
        return BatchResult(COLUMNS, columnar.table_rows(table) if self.as_rows else table)


def _without_hash(rows: list[tuple]) -> list[str]:
    return sorted(repr(row[:-1]) for row in rows)  # (as text: NaN is not equal to itself)


def test_results_copied_as_csv_equal_the_rows_copied_one_by_one(db_url):
    assert columnar.csv_copyable(_result_table())
    enqueue_orders(db_url, order_payloads(1))
    run_until_empty(db_url, _TableEngine(as_rows=False), output_table="by_csv")
    enqueue_orders(db_url, order_payloads(1))
    run_until_empty(db_url, _TableEngine(as_rows=True), output_table="by_rows")

    by_csv, by_rows = table_rows(db_url, "by_csv"), table_rows(db_url, "by_rows")
    assert len(by_csv) == 7 and _without_hash(by_csv) == _without_hash(by_rows)
    assert {r[0] for r in by_csv} >= {"", None, "\\N", 'a "quoted", value', "line\nbreak\r"}


def test_results_csv_cannot_carry_go_row_by_row(db_url):
    table = pyarrow.table({"k": ["a"], "st": [{"x": 1}], "bin": [b"\x00\x01"]})
    assert not columnar.csv_copyable(table)

    class Engine:
        def process(self, jobs, delivery_hash):
            return BatchResult([("k", "text"), ("st", "jsonb"), ("bin", "bytea")], table)

    enqueue_orders(db_url, order_payloads(1))
    run_until_empty(db_url, Engine(), output_table="nested")
    assert [row[:3] for row in table_rows(db_url, "nested")] == [("a", {"x": 1}, b"\x00\x01")]
