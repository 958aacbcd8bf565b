"""Connections: resolve the database URL (or start the embedded PostgreSQL) and open psycopg / SQLAlchemy handles."""

from __future__ import annotations

import json
import os
import select
import time
from collections.abc import Iterable
from typing import Any, TypeVar

import orjson
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool

from outboxq.settings import Settings, get_settings

# What outboxq's own connections are: psycopg connections whose rows are dicts (row_factory=dict_row).
DictConnection = psycopg.Connection[dict[str, Any]]

_resolved_url: str | None = None

Row = TypeVar("Row")


def one_row(cursor: psycopg.Cursor[Row]) -> Row:
    """The row of a statement that always returns exactly one (an aggregate, a lock function, an upsert's
    RETURNING); a RuntimeError, never a None to index, if it did not."""
    row = cursor.fetchone()
    if row is None:
        raise RuntimeError("a statement that returns one row returned none")
    return row


# 19 digits in a row: perhaps an integer beyond 64 bits, which orjson reads as a float (losing digits), not as
# json.loads' exact int. (Digits inside a string count too: those payloads just take json.loads.) Found as a
# run of zeros once every digit is made a zero: bytes.translate and `in` run in C, ten times faster than a
# regular expression's search over a large batch request, and faster on all but the smallest.
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGITS = b"0" * 19


def loads_json(data: bytes | str) -> Any:
    """A json or jsonb value read from PostgreSQL, parsed by orjson: a worker parses every payload it claims, and
    json.loads took a third of a no-op drain's claim time. A value orjson would read differently (an integer of
    19 digits or more) or refuses is parsed by json.loads, as before."""
    raw = data.encode() if isinstance(data, str) else data
    if _LONG_DIGITS not in raw.translate(_DIGITS_TO_ZERO):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def with_fast_json(conn: psycopg.Connection[Row]) -> psycopg.Connection[Row]:
    """`conn`, reading json and jsonb with loads_json (this connection only: psycopg's global loader, which the
    application embedding outboxq may rely on, is left alone)."""
    set_json_loads(loads_json, conn)
    return conn


# A pooled connection returned this recently, with a silent socket, is lent without a round trip. One idle for
# longer gets the round trip: a server that vanished without a word (a host lost, a failover to a new address, a NAT that forgot the flow) leaves the socket silent until the client sends.
POOL_CHECK_IDLE_S = 1.0
_RETURNED_AT = "_outboxq_returned_at"


def pooled_connection_returned(conn: psycopg.Connection[Any]) -> None:
    """A connection pool's `reset` callback: note when the connection came back (check_pooled_connection)."""
    setattr(conn, _RETURNED_AT, time.monotonic())


def check_pooled_connection(conn: psycopg.Connection[Any]) -> None:
    """A connection pool's check before it lends `conn`: a round trip to the server when the connection has been
    idle for over POOL_CHECK_IDLE_S or its socket has something to read (the server ended it: a restart, a
    terminated backend, idle_session_timeout send an error, then the end of the stream); else none."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    idle_s = time.monotonic() - getattr(conn, _RETURNED_AT, float("-inf"))
    if idle_s > POOL_CHECK_IDLE_S or _readable(conn.fileno()):
        ConnectionPool.check_connection(conn)  # raises when the server ended the connection


def _readable(fd: int) -> bool:
    """Whether the socket `fd` has something to read now (poll: select() refuses descriptors over 1023, which
    an application with many files open gives its connections)."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)  # Windows: no poll()
    return bool(readable)


def array_literal(values: Iterable[object]) -> str:
    """A PostgreSQL array literal ('{1,2,3}') of integers or UUIDs, for a parameter cast in its statement
    (`%(ids)s::bigint[]`): a str join, where psycopg dumps a list element by element in Python (a few
    microseconds a job in a worker's completions). Only for values whose text has no comma, quote, brace or
    space."""
    return "{" + ",".join(map(str, values)) + "}"


def database_url(settings: Settings | None = None) -> str:
    """The postgresql:// URL to use: DATABASE_URL when set, else the embedded server (started on first use).

    The URL is exported as DATABASE_URL so that child processes (workers started by `demo`, tests'
    subprocesses) use the same server.
    """
    global _resolved_url
    settings = settings or get_settings()
    if settings.database_url:
        return url_in_schema(normalize_url(settings.database_url), settings.db_schema)
    if _resolved_url is None:
        from outboxq.embedded import start_embedded

        _resolved_url = start_embedded(settings.embedded_data_dir)
        os.environ["DATABASE_URL"] = _resolved_url
    return url_in_schema(_resolved_url, settings.db_schema)


def url_in_schema(url: str, schema: str) -> str:
    """`url` whose connections find outboxq's objects in `schema` first (search_path), then the usual ones.

    The default schema, public, leaves the URL as it is. Handlers' own tables stay reachable: public (and the
    user's own schema) follow outboxq's schema on the path.
    """
    if schema == "public":
        return url
    from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    option = f'-c search_path="{schema}","$user",public'
    if option in query.get("options", ""):
        return url
    query["options"] = f"{query['options']} {option}".strip() if query.get("options") else option
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))  # libpq reads %20, not +


def normalize_url(url: str) -> str:
    """A libpq URL (postgresql://...) from one that may carry a SQLAlchemy driver suffix."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


def sqlalchemy_url(url: str) -> str:
    """The SQLAlchemy URL (psycopg 3 driver) for a libpq URL."""
    return "postgresql+psycopg://" + normalize_url(url)[len("postgresql://") :]


def connect(url: str | None = None, *, autocommit: bool = False, **kwargs: Any) -> DictConnection:
    """A new psycopg connection with dict rows."""
    return psycopg.connect(url or database_url(), autocommit=autocommit, row_factory=dict_row, **kwargs)


def create_engine(url: str | None = None, **kwargs: Any):
    """A SQLAlchemy engine on the psycopg 3 driver."""
    import sqlalchemy

    return sqlalchemy.create_engine(sqlalchemy_url(url or database_url()), **kwargs)


def url_with_database(url: str, name: str) -> str:
    """The same server URL pointing at database `name`."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(normalize_url(url))
    return urlunsplit(parts._replace(path="/" + name))


def url_with_user(url: str, user: str, password: str | None = None) -> str:
    """The same server and database, logging in as `user`."""
    from urllib.parse import quote, urlsplit, urlunsplit

    parts = urlsplit(normalize_url(url))
    host = parts.netloc.rsplit("@", 1)[-1]
    credentials = quote(user, safe="") + (":" + quote(password, safe="") if password else "")
    return urlunsplit(parts._replace(netloc=f"{credentials}@{host}"))
