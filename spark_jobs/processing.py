"""Running a processor over a snapshot's jobs: payloads in, result rows and failed jobs out.

Two engines share one contract (``BatchEngine``): ``SparkEngine`` builds a DataFrame of the payloads and runs
the user's DataFrame → DataFrame function; ``PythonEngine`` runs a plain function over dicts (the plain
worker path the Spark path is compared against, and what tests use without Spark).

A processor that raises is re-run on halves of the batch to isolate the jobs it cannot handle (Spark 4 is
ANSI: one bad cast aborts the whole batch); the isolated jobs fail one by one and the rest are processed
together, once, so an aggregate over the batch is never split. The search is deterministic, so a recovery
that re-processes the same snapshot finds the same bad jobs and writes the same rows.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol, cast

from outboxq.errors import BatchFailed, InvalidInput
from outboxq.spark_jobs import columnar
from outboxq.spark_jobs.delivery import SnapshotJob, describe_exception

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

NOT_AN_OBJECT = "payload is not a JSON object: a Spark processor reads the fields of an object"


@dataclass(slots=True)
class BatchResult:
    """What processing a batch gave: (name, PostgreSQL type) columns, rows, failed jobs (id -> error).

    The rows are sequences of values, or a pyarrow Table (Spark's result, kept in columns for the COPY)."""

    columns: list[tuple[str, str]]
    rows: Sequence[Sequence[Any]] | Any
    failed: dict[int, str] = field(default_factory=dict)
    processor_runs: int = 1


class BatchEngine(Protocol):
    """Turns the payloads of a batch into result rows."""

    def process(self, jobs: Sequence[SnapshotJob], delivery_hash: str) -> BatchResult:
        """Process the batch; raise BatchFailed when no useful part of it can be processed."""
        ...


def load_processor(spec: str) -> Callable[..., Any]:
    """The function named by "module:function" (or "module.function"), or InvalidInput saying why not."""
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidInput("a processor is named module:function, e.g. spark_jobs.examples:order_totals")
    module_name, sep, function_name = spec.partition(":")
    if not sep:
        module_name, _, function_name = spec.rpartition(".")
    if not module_name or not function_name:
        raise InvalidInput(f"invalid processor {spec!r}: name it module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInput(f"processor {spec!r}: cannot import {module_name!r} ({exc})") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise InvalidInput(f"processor {spec!r}: {module_name!r} has no function {function_name!r}")
    return function


def _takes_delivery_hash(function: Callable[..., Any]) -> bool:
    import inspect

    try:
        return "delivery_hash" in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def isolate_failures(
    jobs: Sequence[SnapshotJob],
    attempt: Callable[[Sequence[SnapshotJob]], Any],
    *,
    max_runs: int,
) -> tuple[Any, dict[int, str], int, BaseException | None]:
    """Run ``attempt`` on the jobs; when it raises, bisect to set aside the jobs it fails on.

    Returns (result of the final run on the good jobs or None, failed id -> error, runs, whole-batch error).
    When the bad jobs cannot be isolated within ``max_runs`` runs (a processor broken for every input),
    the last element is the error of the whole batch and nothing was set aside.
    """
    runs = 0
    failed: dict[int, str] = {}

    def run(subset: Sequence[SnapshotJob]) -> tuple[Any, BaseException | None]:
        nonlocal runs
        runs += 1
        try:
            return attempt(subset), None
        except Exception as exc:  # the processor's own error, or Spark's (ANSI cast, analysis)
            return None, exc

    result, error = run(jobs)
    if error is None:
        return result, failed, runs, None
    whole_error = error
    # Each entry is a subset that failed, with its error; only failing halves are searched further.
    pending: list[tuple[list[SnapshotJob], BaseException]] = [(list(jobs), error)]
    while pending:
        subset, subset_error = pending.pop()
        if len(subset) == 1:
            failed[subset[0].id] = describe_exception(subset_error)[0]
            continue
        middle = len(subset) // 2
        for half in (subset[:middle], subset[middle:]):
            if runs >= max_runs:
                return None, {}, runs, whole_error
            _, half_error = run(half)
            if half_error is not None:
                pending.append((half, half_error))
    if not failed or len(failed) == len(jobs):
        # Every half worked (the failure needs the whole batch) or every job failed: a batch failure.
        return None, {}, runs, whole_error
    good = [j for j in jobs if j.id not in failed]
    result, error = run(good)
    if error is not None:  # not a per-job failure after all (it fails for this combination of jobs)
        return None, {}, runs, error
    return result, failed, runs, None


def process_batch(
    jobs: Sequence[SnapshotJob],
    attempt: Callable[[Sequence[SnapshotJob]], tuple[list[tuple[str, str]], Any]],
    *,
    max_runs: int,
) -> BatchResult:
    """Run ``attempt`` (jobs → columns, rows) on the batch: non-objects and isolated bad jobs fail alone.

    Raises BatchFailed when the processor fails for the batch as a whole.
    """
    failed = {j.id: NOT_AN_OBJECT for j in jobs if j.row_json is None}
    usable = [j for j in jobs if j.row_json is not None]
    if not usable:
        return BatchResult([], [], failed, 0)
    outcome, bad, runs, error = isolate_failures(usable, attempt, max_runs=max_runs)
    if error is not None:
        message, traceback = describe_exception(error)
        raise BatchFailed(f"processor failed for the whole batch: {message}", traceback, failed)
    columns, rows = outcome
    return BatchResult(columns, rows, {**failed, **bad}, runs)


class PythonEngine:
    """A plain-Python processor: a function from a list of payload dicts to a list of result dicts."""

    def __init__(self, function: Callable[..., list[dict[str, Any]]], *, max_runs: int = 64) -> None:
        self.function = function
        self.max_runs = max_runs
        self._pass_hash = _takes_delivery_hash(function)

    def process(self, jobs: Sequence[SnapshotJob], delivery_hash: str) -> BatchResult:
        """Run the function on the payloads of the batch."""
        kwargs = {"delivery_hash": delivery_hash} if self._pass_hash else {}

        def attempt(subset: Sequence[SnapshotJob]) -> tuple[list[tuple[str, str]], list[Sequence[Any]]]:
            # (only jobs whose payload is a JSON object reach the engine: their row_json is set)
            records = list(self.function([json.loads(cast(str, j.row_json)) for j in subset], **kwargs))
            columns = _python_columns(records)
            return columns, [[record.get(name) for name, _ in columns] for record in records]

        return process_batch(jobs, attempt, max_runs=self.max_runs)


def _python_columns(records: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    names: dict[str, str] = {}
    for record in records:
        for name, value in record.items():
            if value is not None and names.get(name) in (None, "unknown"):
                names[name] = _python_type(value)
            else:
                names.setdefault(name, "unknown")
    return [(name, "text" if kind == "unknown" else kind) for name, kind in names.items()]


# Python value type -> PostgreSQL column type, most specific first (bool is an int, datetime a date).
_PYTHON_TO_POSTGRES = (
    (bool, "boolean"), (int, "bigint"), (float, "double precision"), (Decimal, "numeric"),
    (datetime, "timestamptz"), (date, "date"), (str, "text"),
)


def _python_type(value: Any) -> str:
    return next((pg for kind, pg in _PYTHON_TO_POSTGRES if isinstance(value, kind)), "jsonb")


# Payloads the schema of a batch is inferred from, evenly spread over it (0: every payload).
DEFAULT_SCHEMA_SAMPLE = 1000


def schema_sample(lines: Sequence[str], size: int) -> list[str]:
    """Up to ``size`` of the lines, evenly spread and always the same for the same lines (a re-processed
    snapshot reads its payloads with the same schema); all of them when size is 0."""
    if size <= 0 or len(lines) <= size:
        return list(lines)
    step = len(lines) / size
    return [lines[int(i * step)] for i in range(size)] + [lines[-1]]


class SparkEngine:
    """A Spark processor: a function from a DataFrame of the payloads (plus job_id, queue) to a DataFrame.

    The payloads' schema is the processor's own when it declares one (a ``payload_schema`` attribute: a
    DDL string such as ``"customer string, amount double"`` or a StructType); otherwise it is inferred from
    a sample of ``schema_sample`` payloads of each batch. A field that none of the sampled payloads has is
    not read: a processor that needs rare fields declares its schema (or set the sample to 0: every payload).
    """

    def __init__(self, spark: SparkSession, function: Callable[..., DataFrame], *, max_runs: int = 32,
                 schema_sample: int = DEFAULT_SCHEMA_SAMPLE) -> None:
        self.spark = spark
        self.function = function
        self.max_runs = max_runs
        self.schema_sample = schema_sample
        self.declared_schema = getattr(function, "payload_schema", None)
        self._pass_hash = _takes_delivery_hash(function)

    def jobs_frame(self, jobs: Sequence[SnapshotJob]) -> DataFrame:
        """The DataFrame of the jobs' payloads: one row per job, a column per payload field.

        The payloads are read with the declared or sampled schema (Spark's own inference reads the data
        twice): by Arrow's JSON reader on the driver when it reads them as Spark would
        (columnar.payload_table), the DataFrame then built from that Arrow table; otherwise they go to
        Spark as one Arrow column of JSON text, parsed there by from_json.
        """
        import pyarrow
        from pyspark.sql import functions as F

        lines = cast(list[str], [j.row_json for j in jobs])  # (JSON objects only, as above)
        if self.declared_schema is not None:
            schema = with_job_fields(self.declared_schema)
        else:
            schema = infer_schema(json.loads(line) for line in schema_sample(lines, self.schema_sample))
        table = columnar.payload_table(lines, schema)
        if table is not None:
            return self.spark.createDataFrame(table, schema=schema)
        raw = self.spark.createDataFrame(pyarrow.table({"value": lines}))
        return raw.select(F.from_json("value", schema).alias("row")).select("row.*")

    def process(self, jobs: Sequence[SnapshotJob], delivery_hash: str) -> BatchResult:
        """Run the DataFrame function on the batch and collect its rows on the driver as an Arrow table."""
        kwargs = {"delivery_hash": delivery_hash} if self._pass_hash else {}

        def attempt(subset: Sequence[SnapshotJob]) -> tuple[list[tuple[str, str]], Any]:
            result = self.function(self.jobs_frame(subset), **kwargs)
            columns = [(f.name, postgres_type(f.dataType)) for f in result.schema.fields]
            return columns, result.toArrow()  # columnar transfer: several times faster than collect() of Rows

        return process_batch(jobs, attempt, max_runs=self.max_runs)


def with_job_fields(schema: Any) -> Any:
    """A declared payload schema (DDL string or StructType) plus the job_id and queue every row carries."""
    from pyspark.sql import types as T

    struct = cast(T.StructType, T._parse_datatype_string(schema) if isinstance(schema, str) else schema)
    names = set(struct.fieldNames())
    extra = [T.StructField(name, kind) for name, kind in (("job_id", T.LongType()), ("queue", T.StringType()))
             if name not in names]
    return T.StructType(list(struct.fields) + extra)


def postgres_type(data_type: Any) -> str:
    """The PostgreSQL column type of a Spark SQL data type (structs, arrays and maps become jsonb)."""
    name = type(data_type).__name__
    if name == "DecimalType":
        return f"numeric({data_type.precision},{data_type.scale})"
    return {
        "StringType": "text", "VarcharType": "text", "CharType": "text",
        "LongType": "bigint", "IntegerType": "integer", "ShortType": "smallint", "ByteType": "smallint",
        "DoubleType": "double precision", "FloatType": "real", "BooleanType": "boolean",
        "DateType": "date", "TimestampType": "timestamptz", "TimestampNTZType": "timestamp",
        "BinaryType": "bytea", "NullType": "text",
    }.get(name, "jsonb")


def infer_schema(records: Iterable[Any]) -> Any:
    """The Spark StructType of JSON objects, merged the way Spark's JSON reader merges (fields sorted).

    Numbers that are all integers are bigint, otherwise double; values of conflicting kinds become a
    string column (Spark's from_json then keeps their JSON text).
    """
    from pyspark.sql import types as T

    merged: dict[str, Any] = {}
    for record in records:
        for name, value in record.items():
            merged[name] = _merge_kind(merged.get(name, _NULL), _kind_of(value))
    return _spark_type(("struct", merged), T)


_NULL = ("null",)
_STRING = ("string",)


def _kind_of(value: Any) -> tuple:
    if value is None:
        return _NULL
    if isinstance(value, bool):
        return ("boolean",)
    if isinstance(value, int):
        return ("long",) if -(2**63) <= value < 2**63 else ("decimal",)
    if isinstance(value, float):
        return ("double",)
    if isinstance(value, str):
        return _STRING
    if isinstance(value, dict):
        fields: dict[str, Any] = {}
        for name, item in value.items():
            fields[name] = _merge_kind(fields.get(name, _NULL), _kind_of(item))
        return ("struct", fields)
    element = _NULL
    for item in value:
        element = _merge_kind(element, _kind_of(item))
    return ("array", element)


def _merge_kind(a: tuple, b: tuple) -> tuple:
    if a == _NULL:
        return b
    if b == _NULL or a == b:
        return a
    numeric = {"long", "double", "decimal"}
    if a[0] in numeric and b[0] in numeric:
        return ("double",) if "double" in (a[0], b[0]) else ("decimal",)
    if a[0] == b[0] == "struct":
        fields = dict(a[1])
        for name, kind in b[1].items():
            fields[name] = _merge_kind(fields.get(name, _NULL), kind)
        return ("struct", fields)
    if a[0] == b[0] == "array":
        return ("array", _merge_kind(a[1], b[1]))
    return _STRING


def _spark_type(kind: tuple, T: Any) -> Any:
    simple = {"null": T.StringType(), "string": T.StringType(), "boolean": T.BooleanType(),
              "long": T.LongType(), "double": T.DoubleType(), "decimal": T.DecimalType(38, 0)}
    if kind[0] in simple:
        return simple[kind[0]]
    if kind[0] == "array":
        return T.ArrayType(_spark_type(kind[1], T))
    return T.StructType([T.StructField(name, _spark_type(kind[1][name], T)) for name in sorted(kind[1])])
