"""A Spark batch kept in Arrow columns: payloads parsed into an Arrow table, results written by COPY as CSV.

Both conversions run in Arrow's C++ code, not row by row in Python: the JSON payloads become an Arrow table
of the payload schema (pyarrow's JSON reader, the driver's cores), the DataFrame built from it needs no
parsing in the JVM, and the processor's result, collected as Arrow, goes to PostgreSQL as CSV blocks.

Each conversion is used only where it gives exactly what the row path gives: a schema or a payload Arrow
cannot read as Spark's ``from_json`` would (``payload_table`` returns None) is parsed by Spark, and a result
with a column CSV cannot carry (``csv_copyable``) is written row by row.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import Any

# Spark types whose JSON values pyarrow's reader parses exactly as Spark's from_json does, or refuses (a
# value of another JSON kind, a number out of range: the whole read fails, and Spark parses the batch).
# Decimals, dates, timestamps, maps and binary follow rules of their own in Spark: from_json reads them.
_ARROW_READABLE = frozenset({"StringType", "LongType", "IntegerType", "DoubleType", "BooleanType"})

# Arrow types whose CSV text PostgreSQL reads back as the same value (strings are always quoted, so that an
# empty string is not NULL; NaN and infinities are written nan, inf, -inf, which float8 and float4 accept).
_CSV_COPYABLE = ("string", "large_string", "int8", "int16", "int32", "int64", "double", "float", "bool",
                 "date32[day]", "null")
_CSV_COPYABLE_PREFIXES = ("decimal", "timestamp[")

# Rows per CSV block sent to COPY: the memory of a block, not of the batch.
CSV_BLOCK_ROWS = 65_536


def arrow_readable(data_type: Any) -> bool:
    """True when pyarrow's JSON reader parses values of this Spark type as Spark's from_json does."""
    name = type(data_type).__name__
    if name == "StructType":
        names = [field.name for field in data_type.fields]
        return len(set(names)) == len(names) and all(arrow_readable(f.dataType) for f in data_type.fields)
    if name == "ArrayType":
        return arrow_readable(data_type.elementType)
    return name in _ARROW_READABLE


def payload_table(lines: Sequence[str], schema: Any) -> Any | None:
    """The payloads (one JSON object per line) as a pyarrow Table of the Spark ``schema``, fields it does not
    name ignored; None when Arrow cannot read them exactly as Spark's from_json would (then Spark reads them,
    with its own rules for a value that does not fit: null, or the JSON text for a string field)."""
    if not lines or not arrow_readable(schema):
        return None
    import pyarrow
    from pyarrow import json as pyarrow_json
    from pyspark.sql.pandas.types import to_arrow_schema

    text = "\n".join(lines).encode()
    options = pyarrow_json.ParseOptions(explicit_schema=to_arrow_schema(schema),
                                        unexpected_field_behavior="ignore", newlines_in_values=False)
    # A block holds whole lines: at least twice the longest (in UTF-8 bytes: up to 4 per character), so that
    # no payload straddles two blocks.
    read = pyarrow_json.ReadOptions(block_size=max(1 << 20, 8 * max(map(len, lines)) + 2))
    try:
        table = pyarrow_json.read_json(pyarrow.py_buffer(text), read_options=read, parse_options=options)
    except pyarrow.ArrowException:
        return None
    return table if table.num_rows == len(lines) else None


def is_arrow_table(rows: Any) -> bool:
    """True when ``rows`` is a pyarrow Table (without importing pyarrow where it was never imported)."""
    pyarrow = sys.modules.get("pyarrow")
    return pyarrow is not None and isinstance(rows, pyarrow.Table)


def csv_copyable(table: Any) -> bool:
    """True when every column of the Arrow table reads back from its CSV text as the same value."""
    return all(str(field.type) in _CSV_COPYABLE or str(field.type).startswith(_CSV_COPYABLE_PREFIXES)
               for field in table.schema)


def csv_blocks(table: Any, last_value: str) -> Iterator[bytes]:
    """The table's rows as CSV (no header) for COPY ... (FORMAT csv), ``last_value`` added to every row."""
    import pyarrow
    from pyarrow import csv as pyarrow_csv

    table = table.append_column("_last", pyarrow.array([last_value] * table.num_rows, pyarrow.string()))
    options = pyarrow_csv.WriteOptions(include_header=False)
    for batch in table.to_batches(max_chunksize=CSV_BLOCK_ROWS):
        sink = pyarrow.BufferOutputStream()
        pyarrow_csv.write_csv(batch, sink, options)
        yield sink.getvalue().to_pybytes()


def table_rows(table: Any) -> list[tuple[Any, ...]]:
    """The table's rows as tuples of Python values (the row path)."""
    return list(zip(*(column.to_pylist() for column in table.columns), strict=True))
