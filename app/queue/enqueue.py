"""enqueue / enqueue_many: write jobs inside the caller's transaction (the transactional outbox).

Nothing here commits. The caller's transaction decides: committed, the job exists and a worker will run
it; rolled back, it never existed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Iterable, Sequence
from datetime import datetime, timedelta
from itertools import repeat
from typing import Any, cast

import orjson
import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from outboxq.errors import DuplicateJob, InvalidInput, InvalidPayload, UnknownDependency
from outboxq.queue import context as job_context
from outboxq.queue import sql
from outboxq.queue.jobs import Job, JobStatus, QueuedBatch
from outboxq.queue.limits import job_limit_key, validate_limit_key
from outboxq.registry import PayloadHooks, Registry, default_registry
from outboxq.settings import get_settings

QUEUE_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
MAX_KEY_LENGTH = 255
PRIORITY_RANGE = (-32768, 32767)


def validate_queue_name(queue: Any) -> str:
    """The queue name, or InvalidInput saying what a valid one looks like."""
    if not isinstance(queue, str) or not QUEUE_NAME_PATTERN.fullmatch(queue):
        raise InvalidInput(
            f"invalid queue name {queue!r}: use 1 to 128 characters from A-Z a-z 0-9 _ . : -"
        )
    return queue


def validate_key(key: Any) -> str | None:
    """The job key (or None), or InvalidInput."""
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH or "\x00" in key:
        raise InvalidInput(f"invalid key {key!r}: use a non-empty string of at most {MAX_KEY_LENGTH} characters "
                           "without NUL")
    return key


UNIQUE_MODES = ("forever", "active")
ON_CONFLICT_MODES = ("raise", "ignore")
ON_DEPENDENCY_FAILURE_MODES = ("wait", "cancel", "run")


def validate_unique(unique: Any, on_conflict: Any, keyed: bool) -> tuple[str, float | None]:
    """(unique_scope, window seconds or None) for enqueue's `unique`, or InvalidInput saying what to pass.

    "forever" (the default): the key is held while the job exists; "active": while it is unfinished; a
    timedelta (or a number of seconds): no second job with the key within that long of the last one.
    """
    if on_conflict not in ON_CONFLICT_MODES:
        raise InvalidInput(f"on_conflict must be one of {', '.join(ON_CONFLICT_MODES)}, not {on_conflict!r}")
    if isinstance(unique, timedelta):
        unique = unique.total_seconds()
    if isinstance(unique, str):
        if unique not in UNIQUE_MODES:
            raise InvalidInput(f"unique must be 'forever', 'active' or a timedelta, not {unique!r}")
        scope, window_s = unique, None
    elif isinstance(unique, int | float) and not isinstance(unique, bool) and 0 < unique < float("inf"):
        scope, window_s = "window", float(unique)
    else:
        raise InvalidInput(f"unique must be 'forever', 'active' or a positive timedelta, not {unique!r}")
    if scope != "forever" and not keyed:
        raise InvalidInput("unique applies to jobs with a key: give key= (keys= for enqueue_many)")
    return scope, window_s


def _validate_options(
    run_at: datetime | None, delay: float | None, priority: int, max_attempts: int | None
) -> float:
    if run_at is not None and delay is not None:
        raise InvalidInput("give either run_at or delay, not both")
    if run_at is not None and (not isinstance(run_at, datetime) or run_at.tzinfo is None):
        raise InvalidInput("run_at must be a timezone-aware datetime (for example datetime.now(timezone.utc))")
    if delay is not None and (isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0):
        raise InvalidInput(f"delay must be a number of seconds >= 0, not {delay!r}")
    if isinstance(priority, bool) or not isinstance(priority, int) or not (
        PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]
    ):
        raise InvalidInput(f"priority must be an integer from {PRIORITY_RANGE[0]} to {PRIORITY_RANGE[1]}")
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 0
    ):
        raise InvalidInput("max_attempts must be an integer >= 0 (0 means retry forever)")
    return float(delay or 0.0)


_JSON_SCALARS = frozenset((str, int, bool, type(None)))


def _plain_json(value: Any) -> bool:
    """True when `value` is built of dict (with str keys), list, tuple, str, int, finite float, bool and None
    alone, exact types (no subclass): values orjson writes as json.dumps does, but for the spelling (UTF-8 for
    \\u escapes, 1e16 for 1e+16), which PostgreSQL's jsonb reads as the same value."""
    kind = type(value)
    if kind is dict:
        for k, v in value.items():
            if type(k) is not str or (type(v) not in _JSON_SCALARS and not _plain_json(v)):
                return False
        return True
    if kind is list or kind is tuple:
        for v in value:
            if type(v) not in _JSON_SCALARS and not _plain_json(v):
                return False
        return True
    # NaN and the infinities are the floats with x - x != 0: json.dumps(allow_nan=False) refuses them, orjson
    # would write null.
    return kind in _JSON_SCALARS or (kind is float and value - value == 0.0)


def payload_json(payload: Any) -> str:
    """The payload as JSON text, or InvalidPayload: json.dumps(allow_nan=False)'s verdict on every payload.

    Payloads of plain JSON types go through orjson (with the type check, a seventh of json.dumps' time on small
    payloads); anything else, and what orjson refuses (ints beyond 64 bits, lone surrogates, nesting past 254
    levels), goes through json.dumps, so that nothing it refuses (NaN, UUIDs, enums, circular data) is written.
    """
    try:
        if _plain_json(payload):
            return orjson.dumps(payload).decode()
    except (orjson.JSONEncodeError, RecursionError):  # circular or very deep data: json.dumps gives the verdict
        pass
    try:
        return json.dumps(payload, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"payload is not JSON ({exc}); pass JSON values or register a codec") from exc


def _encode_payload(queue: str, payload: Any, hooks: PayloadHooks | None) -> tuple[str | None, bytes | None]:
    """(json text, None) with the default JSON codec, or (None, bytes) with the queue's own codec (its consumer's
    payload hooks, None when it has none), after the consumer's valid_payload check."""
    if hooks is not None and hooks.valid_payload is not None and not hooks.valid_payload(payload):
        raise InvalidPayload(f"payload rejected by the valid_payload check of queue {queue!r}: {payload!r:.200}")
    if hooks is not None and hooks.encode is not None:
        encoded = hooks.encode(payload)
        return None, encoded.encode() if isinstance(encoded, str) else bytes(encoded)
    return payload_json(payload), None


def _limit_key_of(payload: Any, given: str | None, hooks: PayloadHooks | None) -> str | None:
    """The job's limit key: the one given to enqueue, else the consumer's limit_by applied to the payload (the
    shared NO_LIMIT_KEY where it gives none); None for a queue without limit_by."""
    if given is not None:
        return validate_limit_key(given)
    return None if hooks is None or hooks.limit_by is None else job_limit_key(hooks.limit_by, payload)


def psycopg_connection(conn: Any) -> psycopg.Connection:
    """The psycopg connection behind a psycopg Connection, a SQLAlchemy Connection or a SQLAlchemy Session.

    Statements run on it belong to the caller's current transaction.
    """
    if isinstance(conn, psycopg.Connection):
        return conn
    try:
        from sqlalchemy.engine import Connection as SAConnection
        from sqlalchemy.orm import Session
    except ImportError:  # pragma: no cover - SQLAlchemy is a dependency
        SAConnection = Session = ()  # type: ignore[assignment,misc]
    if isinstance(conn, Session):
        conn = conn.connection()  # begins the session's transaction if it has none
    if isinstance(conn, SAConnection):
        if not conn.in_transaction():
            # Begin as SQLAlchemy's own execute would: otherwise conn.commit() has no transaction to commit
            # and the job, written on the driver connection underneath, is rolled back when it closes.
            conn.begin()
        driver = conn.connection.driver_connection
        if isinstance(driver, psycopg.Connection):
            return driver
        raise InvalidInput(
            "the SQLAlchemy engine must use the psycopg 3 driver (a postgresql+psycopg:// URL), "
            f"not {type(driver).__module__}"
        )
    raise InvalidInput(
        f"conn must be a psycopg Connection, a SQLAlchemy Connection or Session, not {type(conn).__name__}"
        + (" (use enqueue_async() for async connections)" if "Async" in type(conn).__name__ else "")
    )


async def async_psycopg_connection(conn: Any) -> psycopg.AsyncConnection:
    """The psycopg AsyncConnection behind a psycopg AsyncConnection or a SQLAlchemy AsyncSession /
    AsyncConnection (psycopg async driver); statements run on it belong to the caller's transaction."""
    if isinstance(conn, psycopg.AsyncConnection):
        return conn
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession

    if isinstance(conn, AsyncSession):
        conn = await conn.connection()  # begins the session's transaction if it has none
    if isinstance(conn, SAAsyncConnection):
        if not conn.in_transaction():
            await conn.begin()  # as in psycopg_connection: so that conn.commit() commits the job
        driver = (await conn.get_raw_connection()).driver_connection
        if isinstance(driver, psycopg.AsyncConnection):
            return driver
        raise InvalidInput(
            "the SQLAlchemy async engine must use the psycopg 3 driver (a postgresql+psycopg:// URL), "
            f"not {type(driver).__module__}"
        )
    raise InvalidInput(
        "conn must be a psycopg AsyncConnection or a SQLAlchemy AsyncSession / AsyncConnection, not "
        f"{type(conn).__name__} (use enqueue() for sync connections)"
    )


# ---------------------------------------------------------------- the writes, once for sync and async callers
#
# enqueue and enqueue_many are written once, as plans: generators that validate their arguments, then yield
# the statements to run (a Statement or a Copy) and receive each one's rows. `_run_plan` runs a plan on a
# psycopg Connection, `_run_plan_async` on an AsyncConnection, so the sync and async calls cannot drift apart.


class Statement:
    """One statement of a plan; `rows` says what the plan gets back: "all", "one" or "none". A statement
    `only_in_transaction` (a savepoint) runs only inside the caller's open transaction; the plan gets back
    whether it ran."""

    __slots__ = ("text", "params", "rows", "only_in_transaction")

    def __init__(self, text: str, params: dict[str, Any], rows: str = "all", only_in_transaction: bool = False):
        self.text, self.params, self.rows = text, params, rows
        self.only_in_transaction = only_in_transaction


def _outside_transaction(pg: psycopg.Connection | psycopg.AsyncConnection) -> bool:
    """True when each statement on the caller's connection is a transaction of its own: autocommit, not in a
    `conn.transaction()` block (without autocommit, psycopg begins one at the first statement)."""
    return pg.autocommit and pg.info.transaction_status != TransactionStatus.INTRANS


def _skipped(step: Statement, pg: psycopg.Connection | psycopg.AsyncConnection) -> bool:
    """True when `step` runs only inside a transaction and the caller's connection has none."""
    return step.only_in_transaction and _outside_transaction(pg)


class Copy:
    """A COPY ... FROM STDIN of these rows (the plan gets None back)."""

    __slots__ = ("text", "rows")

    def __init__(self, text: str, rows: Iterable[tuple[Any, ...]]):
        self.text, self.rows = text, rows


class InTransaction:
    """Asks whether the plan's statements share one transaction (the caller's): the plan gets back False on an
    autocommit connection outside a transaction block, where each statement commits on its own. Nothing is
    sent to the server."""

    __slots__ = ()


Plan = Generator[Statement | Copy | InTransaction, Any, Any]


def _run_plan(conn: Any, plan: Plan) -> Any:
    """Run a plan on the caller's connection (psycopg or SQLAlchemy), in its current transaction."""
    try:
        step = next(plan)  # the arguments are validated here, before the connection is touched
    except StopIteration as done:
        return done.value
    pg = psycopg_connection(conn)
    schema = get_settings().db_schema
    result: Any
    with pg.cursor(row_factory=dict_row) as cur:
        while True:
            if isinstance(step, Copy):
                with cur.copy(sql.qualified(step.text, schema)) as copy:
                    for row in step.rows:
                        copy.write_row(row)
                result = None
            elif isinstance(step, InTransaction):
                result = not _outside_transaction(pg)
            elif _skipped(step, pg):
                result = False
            else:
                cur.execute(sql.qualified(step.text, schema), step.params)
                result = cur.fetchall() if step.rows == "all" else cur.fetchone() if step.rows == "one" else None
                result = True if step.only_in_transaction else result
            try:
                step = plan.send(result)
            except StopIteration as done:
                return done.value


async def _run_plan_async(conn: Any, plan: Plan) -> Any:
    """Run a plan on the caller's async connection (psycopg or SQLAlchemy), in its current transaction."""
    try:
        step = next(plan)  # the arguments are validated here, before the connection is touched
    except StopIteration as done:
        return done.value
    pg = await async_psycopg_connection(conn)
    schema = get_settings().db_schema
    result: Any
    async with pg.cursor(row_factory=dict_row) as cur:
        while True:
            if isinstance(step, Copy):
                async with cur.copy(sql.qualified(step.text, schema)) as copy:
                    for row in step.rows:
                        await copy.write_row(row)
                result = None
            elif isinstance(step, InTransaction):
                result = not _outside_transaction(pg)
            elif _skipped(step, pg):
                result = False
            else:
                await cur.execute(sql.qualified(step.text, schema), step.params)
                if step.only_in_transaction:
                    result = True
                elif step.rows == "all":
                    result = await cur.fetchall()
                else:
                    result = await cur.fetchone() if step.rows == "one" else None
            try:
                step = plan.send(result)
            except StopIteration as done:
                return done.value


def _resolve_dependencies(depends_on: Iterable[Sequence[str]], on_failure: str = "wait"
                          ) -> Generator[Statement, Any, tuple[list[int], JobStatus, str | None]]:
    wanted: list[tuple[str, str]] = []
    for entry in depends_on:
        pair: Any = (entry.get("queue"), entry.get("key")) if isinstance(entry, dict) else entry
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise InvalidInput(f"each depends_on entry must be a (queue, key) pair, not {pair!r}")
        wanted.append((validate_queue_name(pair[0]), validate_key(pair[1]) or ""))
    wanted = list(dict.fromkeys(wanted))
    if not wanted:
        return [], JobStatus.QUEUED, None
    rows = yield Statement(sql.job_find_by_keys,
                           {"queues": [q for q, _ in wanted], "keys": [k for _, k in wanted]})
    found = {(r["queue"], r["key"]): r for r in rows}
    missing = [pair for pair in wanted if pair not in found]
    if missing:
        raise UnknownDependency(missing)
    rows = [found[pair] for pair in wanted]
    ids = [r["id"] for r in rows]
    failed = (JobStatus.DEAD.value, JobStatus.CANCELLED.value)
    ready = (JobStatus.DONE.value, *failed) if on_failure == "run" else (JobStatus.DONE.value,)
    if all(r["status"] in ready for r in rows):
        return ids, JobStatus.QUEUED, None
    blocked = [r for r in rows if r["status"] in failed]
    reason = "; ".join(
        f"dependency {r['id']} (queue {r['queue']}, key {r['key']}) is {r['status']}" for r in blocked
    )
    if blocked and on_failure == "cancel":
        return ids, JobStatus.CANCELLED, reason
    return ids, JobStatus.WAITING, reason or None


def _enqueue_plan(
    queue: str,
    payload: Any,
    *,
    key: str | None,
    depends_on: Iterable[Sequence[str]],
    run_at: datetime | None,
    delay: float | None,
    priority: int,
    max_attempts: int | None,
    limit_key: str | None = None,
    unique: Any = "forever",
    on_conflict: str = "raise",
    on_dependency_failure: str = "wait",
    registry: Registry | None = None,
    sequence: str | None = None,
    on_failure: str = "hold",
) -> Plan:
    registry = registry or default_registry
    validate_queue_name(queue)
    validate_key(key)
    _validate_sequence(sequence, on_failure)
    delay_s = _validate_options(run_at, delay, priority, max_attempts)
    unique_scope, window_s = validate_unique(unique, on_conflict, key is not None)
    _validate_dependency_mode(on_dependency_failure)
    hooks = registry.payload_hooks(queue)
    limit_key = _limit_key_of(payload, limit_key, hooks)
    payload_json, payload_bytes = _encode_payload(queue, payload, hooks)
    if hooks is not None and hooks.depends_on is not None:
        depends_on = [*depends_on, *hooks.depends_on(payload)]
    context = job_context.capture(queue)
    if window_s is not None and key is not None:  # (a window is only accepted with a key)
        holders = yield from _recent_with_keys(queue, [key], window_s)
        if holders:
            return _on_conflict(on_conflict, queue, holders[key])
    dependency_ids, status, waiting_reason = yield from _resolve_dependencies(depends_on, on_dependency_failure)
    before = None
    if sequence is not None:
        before, status, waiting_reason = yield from _sequence_turn(sequence, on_failure, status, waiting_reason)
    row = yield Statement(
        sql.job_insert,
        {"queue": queue, "key": key, "status": status.value, "payload": payload_json,
         "payload_bytes": payload_bytes, "priority": priority, "run_at": run_at, "delay": delay_s,
         "max_attempts": max_attempts, "context": context, "waiting_reason": waiting_reason,
         "limit_key": limit_key, "unique_scope": unique_scope, "on_dependency_failure": on_dependency_failure,
         "sequence": sequence},
        rows="one",
    )
    if row is None:
        holders = yield from _key_holders(queue, [key or ""])
        return _on_conflict(on_conflict, queue, holders.get(key or ""), key=key or "")
    if dependency_ids:
        yield Statement(sql.job_dependencies_insert, {"job_id": row["id"], "depends_on_ids": dependency_ids},
                        rows="none")
    if sequence is not None:
        yield from _sequence_link(sequence, on_failure, row["id"], before)
    return _written_job(row, queue, payload, priority=priority, max_attempts=max_attempts,
                        context=json.loads(context) if context else None, key=key,
                        waiting_reason=waiting_reason, sequence=sequence)


def _key_list(queue: str, keys: Sequence[str | None] | None, count: int, on_conflict: str) -> list[str | None]:
    """One valid key (or None) per payload; a key given twice in one call is a DuplicateJob unless ignored."""
    if keys is None:
        return [None] * count
    key_list = [validate_key(k) for k in keys]
    if len(key_list) != count:
        raise InvalidInput(f"keys has {len(key_list)} entries for {count} payloads")
    seen: set[str] = set()
    for k in key_list:
        if k is not None:
            if k in seen and on_conflict == "raise":
                raise DuplicateJob(queue, k)
            seen.add(k)
    return key_list


SEQUENCE_FAILURE_MODES = ("hold", "continue")


def _validate_sequence(sequence: Any, on_failure: Any) -> None:
    """Refuse a bad sequence name, or an on_failure that is not "hold" or "continue" (or given without one)."""
    if sequence is not None and (not isinstance(sequence, str) or not sequence or len(sequence) > MAX_KEY_LENGTH
                                 or "\x00" in sequence):
        raise InvalidInput(f"invalid sequence {sequence!r}: use a non-empty string of at most {MAX_KEY_LENGTH} "
                           "characters without NUL")
    if on_failure not in SEQUENCE_FAILURE_MODES:
        raise InvalidInput(f"on_failure must be one of {', '.join(SEQUENCE_FAILURE_MODES)}, not {on_failure!r}")
    if on_failure != "hold" and sequence is None:
        raise InvalidInput("on_failure applies to a sequence: pass sequence=... with it")


def _sequence_turn(sequence: str, on_failure: str, status: JobStatus, reason: str | None
                   ) -> Generator[Any, Any, tuple[int | None, JobStatus, str | None]]:
    """Take the sequence's turn (held until the caller's transaction ends) and find the job before this one:
    (its id when this job must wait for it, the job's status, its waiting reason)."""
    if not (yield InTransaction()):
        raise InvalidInput("enqueue(sequence=...) needs a transaction (an autocommit connection inside "
                           "`with conn.transaction():`, or a connection without autocommit): the sequence's turn "
                           "is held until commit, so that the next job sees this one")
    row = yield Statement(sql.sequence_take_turn, {"sequence": sequence}, rows="one")
    before = None if row["last_job_id"] is None else (
        yield Statement(sql.job_status_of, {"id": row["last_job_id"]}, rows="one"))
    finished = ("done", "cancelled", "dead") if on_failure == "continue" else ("done", "cancelled")
    if before is None or before["status"] in finished:  # none before, pruned (finished), or finished
        return None, status, reason
    if before["status"] == "dead":
        held = (f"sequence {sequence}: job {before['id']} (queue {before['queue']}, key {before['key'] or '-'}) "
                "is dead; retry or cancel it to go on")
        reason = f"{reason}; {held}" if reason else held
    return before["id"], JobStatus.CANCELLED if status is JobStatus.CANCELLED else JobStatus.WAITING, reason


def _sequence_link(sequence: str, on_failure: str, job_id: int, before: int | None) -> Plan:
    """Record this job as its sequence's newest, and its link to the job before (when it must wait for it)."""
    if before is not None:
        yield Statement(sql.job_sequence_link_insert, {
            "job_id": job_id, "depends_on_id": before,
            "on_failure": "run" if on_failure == "continue" else "sequence"}, rows="none")
    yield Statement(sql.sequence_set_last, {"sequence": sequence, "job_id": job_id}, rows="none")


def _validate_dependency_mode(on_dependency_failure: str) -> None:
    """Refuse an on_dependency_failure that is not one of the modes."""
    if on_dependency_failure not in ON_DEPENDENCY_FAILURE_MODES:
        raise InvalidInput(f"on_dependency_failure must be one of {', '.join(ON_DEPENDENCY_FAILURE_MODES)}, "
                           f"not {on_dependency_failure!r}")


def _enqueue_many_plan(
    queue: str,
    payloads: Iterable[Any],
    *,
    keys: Sequence[str | None] | None,
    run_at: datetime | None,
    delay: float | None,
    priority: int,
    max_attempts: int | None,
    limit_keys: Sequence[str | None] | None = None,
    unique: Any = "forever",
    on_conflict: str = "raise",
    registry: Registry | None = None,
) -> Plan:
    registry = registry or default_registry
    validate_queue_name(queue)
    delay_s = _validate_options(run_at, delay, priority, max_attempts)
    unique_scope, window_s = validate_unique(unique, on_conflict, keys is not None)
    payloads = list(payloads)
    if limit_keys is not None and len(limit_keys) != len(payloads):
        raise InvalidInput(f"limit_keys has {len(limit_keys)} entries for {len(payloads)} payloads")
    hooks = registry.payload_hooks(queue)  # looked up once for the batch, not once per payload
    if limit_keys is None and (hooks is None or hooks.limit_by is None):
        limit_key_list: list[str | None] = [None] * len(payloads)
    else:
        limit_key_list = [_limit_key_of(p, None if limit_keys is None else limit_keys[i], hooks)
                          for i, p in enumerate(payloads)]
    key_list = _key_list(queue, keys, len(payloads), on_conflict)
    if not payloads:
        return []
    if hooks is None:  # the default JSON codec and no validation: skip the per-payload hook checks
        encoded: list[tuple[str | None, bytes | None]] = [(payload_json(p), None) for p in payloads]
    else:
        encoded = [_encode_payload(queue, p, hooks) for p in payloads]
    context = job_context.capture(queue)
    options: dict[str, Any] = {"priority": priority, "run_at": run_at, "delay_s": delay_s,
                               "max_attempts": max_attempts, "context": context}
    if keys is None or all(k is None for k in key_list):
        return (yield from _copy_jobs(queue, payloads, encoded, limit_keys=limit_key_list, **options))
    results = yield from _insert_keyed_jobs(
        queue, key_list, encoded, limit_key_list, unique_scope=unique_scope, window_s=window_s,
        on_conflict=on_conflict, **options)
    context_value = json.loads(context) if context else None
    built: dict[int, Job] = {}  # a key given twice (on_conflict="ignore") gets one job, the first payload's
    for result, payload in zip(results, payloads, strict=True):
        if not isinstance(result, Job) and result["id"] not in built:
            built[result["id"]] = _written_job(result, queue, payload, priority=priority,
                                               max_attempts=max_attempts, context=context_value,
                                               key=result["key"])
    return [result if isinstance(result, Job) else built[result["id"]] for result in results]


def enqueue(
    conn: Any,
    queue: str,
    payload: Any,
    *,
    key: str | None = None,
    depends_on: Iterable[Sequence[str]] = (),
    run_at: datetime | None = None,
    delay: float | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    limit_key: str | None = None,
    unique: str | timedelta = "forever",
    on_conflict: str = "raise",
    on_dependency_failure: str = "wait",
    registry: Registry | None = None,
    sequence: str | None = None,
    on_failure: str = "hold",
) -> Job:
    """Write one job in the caller's transaction and return it; nothing is committed here.

    `conn` is a psycopg Connection or a SQLAlchemy Session / Connection. Raises DuplicateJob when
    (queue, key) is held by another job, UnknownDependency when a depends_on pair has no job (before
    anything is written), InvalidInput / InvalidPayload for arguments to fix. `unique` says how long this
    job holds its key: "forever" (while it exists), "active" (while unfinished) or a timedelta (no second job
    with the key within that long); `on_conflict="ignore"` returns the job holding the key instead of raising.
    `on_dependency_failure`: what this job does when a dependency ends dead or cancelled ("wait", "cancel",
    "run"). `registry`: whose consumers' payload hooks (codec, validation, dependencies, limit key) apply
    (outboxq.registry.default_registry, which @consumer fills, unless given). `sequence`: the jobs of one
    sequence run one at a time, in enqueue (commit) order, across any number of workers; a dead job holds its
    sequence until it is retried or cancelled, unless `on_failure="continue"` (needs a transaction).
    """
    plan = _enqueue_plan(queue, payload, key=key, depends_on=depends_on, run_at=run_at, delay=delay,
                         priority=priority, max_attempts=max_attempts, limit_key=limit_key, unique=unique,
                         on_conflict=on_conflict, on_dependency_failure=on_dependency_failure, registry=registry,
                         sequence=sequence, on_failure=on_failure)
    return _run_plan(conn, plan)


async def enqueue_async(
    conn: Any,
    queue: str,
    payload: Any,
    *,
    key: str | None = None,
    depends_on: Iterable[Sequence[str]] = (),
    run_at: datetime | None = None,
    delay: float | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    limit_key: str | None = None,
    unique: str | timedelta = "forever",
    on_conflict: str = "raise",
    on_dependency_failure: str = "wait",
    registry: Registry | None = None,
    sequence: str | None = None,
    on_failure: str = "hold",
) -> Job:
    """enqueue() for async code: `conn` is a psycopg AsyncConnection or a SQLAlchemy AsyncSession /
    AsyncConnection; same options, validation and errors, and it never commits."""
    plan = _enqueue_plan(queue, payload, key=key, depends_on=depends_on, run_at=run_at, delay=delay,
                         priority=priority, max_attempts=max_attempts, limit_key=limit_key, unique=unique,
                         on_conflict=on_conflict, on_dependency_failure=on_dependency_failure, registry=registry,
                         sequence=sequence, on_failure=on_failure)
    return await _run_plan_async(conn, plan)


def enqueue_many(
    conn: Any,
    queue: str,
    payloads: Iterable[Any],
    *,
    keys: Sequence[str | None] | None = None,
    run_at: datetime | None = None,
    delay: float | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    limit_keys: Sequence[str | None] | None = None,
    unique: str | timedelta = "forever",
    on_conflict: str = "raise",
    registry: Registry | None = None,
) -> list[Job]:
    """Write many jobs of one queue in one statement, in the caller's transaction; all or none.

    `keys`, when given, has one key (or None) per payload.
    """
    plan = _enqueue_many_plan(queue, payloads, keys=keys, run_at=run_at, delay=delay, priority=priority,
                              max_attempts=max_attempts, limit_keys=limit_keys, unique=unique,
                              on_conflict=on_conflict, registry=registry)
    return _as_jobs(_run_plan(conn, plan))


def enqueue_many_written(conn: Any, queue: str, payloads: Iterable[Any], **options: Any) -> QueuedBatch | list[Job]:
    """enqueue_many for a caller that needs no Job objects (the API, which answers in JSON): key-less jobs come
    back as a QueuedBatch, their ids and what they share. `options` are enqueue_many's, keys, run_at, delay,
    priority and max_attempts always given."""
    return _run_plan(conn, _enqueue_many_plan(queue, payloads, **options))


async def enqueue_many_async(
    conn: Any,
    queue: str,
    payloads: Iterable[Any],
    *,
    keys: Sequence[str | None] | None = None,
    run_at: datetime | None = None,
    delay: float | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    limit_keys: Sequence[str | None] | None = None,
    unique: str | timedelta = "forever",
    on_conflict: str = "raise",
    registry: Registry | None = None,
) -> list[Job]:
    """enqueue_many() for async code (psycopg AsyncConnection, SQLAlchemy AsyncSession / AsyncConnection)."""
    plan = _enqueue_many_plan(queue, payloads, keys=keys, run_at=run_at, delay=delay, priority=priority,
                              max_attempts=max_attempts, limit_keys=limit_keys, unique=unique,
                              on_conflict=on_conflict, registry=registry)
    return _as_jobs(await _run_plan_async(conn, plan))


def _as_jobs(written: QueuedBatch | list[Job]) -> list[Job]:
    """The Jobs a many-job plan wrote."""
    return written.jobs() if isinstance(written, QueuedBatch) else written


def _written_job(row: dict[str, Any], queue: str, payload: Any, *, priority: int, max_attempts: int | None,
                 context: Any, key: str | None, waiting_reason: str | None = None, sequence: str | None = None
                 ) -> Job:
    """The Job just written: what the caller gave plus what the database assigned (id, status, times)."""
    return Job(id=row["id"], queue=queue, key=key, status=JobStatus(row["status"]), payload=payload,
               priority=priority, run_at=row["run_at"], max_attempts=max_attempts,
               waiting_reason=waiting_reason, context=context, created_at=row["created_at"], sequence=sequence)


def _copy_jobs(queue: str, payloads: list[Any], encoded: list[tuple[str | None, bytes | None]], *,
               priority: int, run_at: datetime | None, delay_s: float | None, max_attempts: int | None,
               context: str | None, limit_keys: list[str | None]
               ) -> Generator[Statement | Copy | InTransaction, Any, QueuedBatch]:
    """Write key-less jobs with COPY (no key can conflict) and return them (as a QueuedBatch).

    Only the columns whose values differ from the column defaults are sent (see sql.JOB_COPY_COLUMNS). run_at
    and created_at default to now(), the start of the transaction, which is the `now` read with the ids when
    the COPY runs in the same transaction; on an autocommit connection it does not, and both are sent.
    """
    same_transaction = yield InTransaction()
    reserved = yield Statement(sql.job_reserve_ids, {"n": len(encoded)}, rows="one")
    ids, now = reserved["ids"], reserved["now"]
    due = run_at or (now + timedelta(seconds=delay_s or 0.0))
    columns: list[str] = ["id", "queue", "payload"]
    texts = [text for text, _ in encoded]
    values: list[Iterable[Any]] = [ids, repeat(queue), texts]
    binary = any(data is not None for _, data in encoded)
    if binary:
        columns.append("payload_bytes")
        values.append([data for _, data in encoded])
    if priority:
        columns.append("priority")
        values.append(repeat(priority))
    if due != now or not same_transaction:
        columns.append("run_at")
        values.append(repeat(due))
    if max_attempts is not None:
        columns.append("max_attempts")
        values.append(repeat(max_attempts))
    if context is not None:
        columns.append("context")
        values.append(repeat(context))
    if not same_transaction:
        columns.append("created_at")
        values.append(repeat(now))
    if any(k is not None for k in limit_keys):
        columns.append("limit_key")
        values.append(limit_keys)
    yield Copy(sql.job_copy(tuple(columns)), zip(*values, strict=False))  # (the repeats are endless)
    if due <= now:
        yield Statement(sql.job_notify_ready, {"queue": queue}, rows="none")
    return QueuedBatch(ids, payloads, queue=queue, priority=priority, run_at=due, max_attempts=max_attempts,
                       context=json.loads(context) if context else None, created_at=now,
                       payload_texts=None if binary else cast(list[str], texts))


def _insert_keyed_jobs(
    queue: str, key_list: list[str | None], encoded: list[tuple[str | None, bytes | None]],
    limit_keys: list[str | None], *, unique_scope: str, window_s: float | None, on_conflict: str, priority: int,
    run_at: datetime | None, delay_s: float | None, max_attempts: int | None, context: str | None,
) -> Generator[Statement, Any, list[dict[str, Any] | Job]]:
    """Write jobs with keys in one INSERT. One entry per payload: its written row or, with
    on_conflict="ignore", the Job holding its key; with "raise", DuplicateJob and this call's rows undone."""
    keys = [k for k in key_list if k is not None]
    held: dict[str, Job] = {}
    if window_s is not None:
        held = yield from _recent_with_keys(queue, keys, window_s)
        if held and on_conflict == "raise":
            raise DuplicateJob(queue, next(k for k in keys if k in held))
    seen: set[str] = set()
    to_write = []
    for i, k in enumerate(key_list):
        if k is None or (k not in held and k not in seen):
            to_write.append(i)
            if k is not None:
                seen.add(k)
    # A savepoint undoes a refused call without DELETE (which the API's role may not have); on an autocommit
    # connection there is no transaction to hold one, and the rows written are deleted instead.
    in_savepoint = yield Statement(sql.enqueue_savepoint, {}, rows="none", only_in_transaction=True)
    rows = yield Statement(
        sql.job_insert_many,
        {
            "queue": queue,
            "keys": [key_list[i] for i in to_write],
            "payloads": [encoded[i][0] for i in to_write],
            "payloads_bytes": [encoded[i][1] for i in to_write],
            "limit_keys": [limit_keys[i] for i in to_write],
            "priority": priority,
            "run_at": run_at,
            "delay": delay_s,
            "max_attempts": max_attempts,
            "context": context,
            "unique_scope": unique_scope,
        },
    )
    inserted = {r["key"]: r for r in rows if r["key"] is not None}
    refused = [k for k in (key_list[i] for i in to_write) if k is not None and k not in inserted]
    if refused:
        if on_conflict == "raise":
            # A key was held: undo this call's rows so the caller's transaction stays whole.
            if in_savepoint:
                yield Statement(sql.enqueue_savepoint_rollback, {}, rows="none")
                yield Statement(sql.enqueue_savepoint_release, {}, rows="none")
            else:
                yield Statement(sql.job_delete_by_ids, {"ids": [r["id"] for r in rows]}, rows="none")
            raise DuplicateJob(queue, refused[0])
        holders = yield from _key_holders(queue, refused)
        held.update(holders)
    if in_savepoint:
        yield Statement(sql.enqueue_savepoint_release, {}, rows="none")
    return _keyed_results(queue, key_list, rows, inserted, held)


def _keyed_results(queue: str, key_list: list[str | None], rows: list[dict[str, Any]],
                   inserted: dict[str, dict[str, Any]], held: dict[str, Job]) -> list[dict[str, Any] | Job]:
    """One entry per key of the call, in its order: the row written for it, or the Job that holds its key."""
    unkeyed = iter([r for r in rows if r["key"] is None])
    results: list[dict[str, Any] | Job] = []
    for k in key_list:
        if k is None:
            results.append(next(unkeyed))
        elif k in inserted:
            results.append(inserted[k])
        elif k in held:
            results.append(held[k])
        else:  # held by a job this transaction's snapshot cannot see (REPEATABLE READ): nothing to return
            raise DuplicateJob(queue, k)
    return results


def _recent_with_keys(queue: str, keys: list[str], window_s: float) -> Generator[Statement, Any, dict[str, Job]]:
    """Lock the keys until the transaction ends, then the newest job of each created within the window."""
    yield Statement(sql.job_key_lock, {"queue": queue, "keys": keys}, rows="none")
    rows = yield Statement(sql.job_find_recent_by_keys, {"queue": queue, "keys": keys, "window_s": window_s})
    return {r["key"]: _stored_job(r) for r in rows}


def _key_holders(queue: str, keys: list[str]) -> Generator[Statement, Any, dict[str, Job]]:
    """The jobs that hold these keys (after an insert that did nothing)."""
    rows = yield Statement(sql.job_find_key_holders, {"queue": queue, "keys": keys})
    return {r["key"]: _stored_job(r) for r in rows}


def _on_conflict(on_conflict: str, queue: str, holder: Job | None, *, key: str | None = None) -> Job:
    """What enqueue returns when its key is held: the holding job ("ignore"), else DuplicateJob."""
    if on_conflict == "ignore" and holder is not None:
        return holder
    raise DuplicateJob(queue, key if key is not None else (holder.key if holder else "") or "")


def _stored_job(row: dict[str, Any]) -> Job:
    """A Job from a row of JOB_COLUMNS (a codec's payload comes back as bytes)."""
    row = dict(row)
    if row.get("payload") is None and row.get("payload_bytes") is not None:
        row["payload"] = bytes(row["payload_bytes"])
    return Job.from_row(row)


def _get_job_plan(job_id: int) -> Plan:
    row = yield Statement(sql.job_get, {"id": job_id}, rows="one")
    return None if row is None else _stored_job(row)


def get_job(conn: Any, job_id: int) -> Job | None:
    """The job with this id (from any of the accepted connection types), or None."""
    return _run_plan(conn, _get_job_plan(job_id))


async def get_job_async(conn: Any, job_id: int) -> Job | None:
    """get_job() for async code (psycopg AsyncConnection, SQLAlchemy AsyncSession / AsyncConnection)."""
    return await _run_plan_async(conn, _get_job_plan(job_id))
