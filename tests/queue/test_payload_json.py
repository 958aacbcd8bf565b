"""Payload JSON: orjson writes plain payloads, json.dumps everything else; the stored value and the refusals are
json.dumps' own (enqueue_many's COPY, its keyed INSERT and enqueue alike)."""

from __future__ import annotations

import enum
import json
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest
from psycopg.rows import dict_row

from outboxq import enqueue, enqueue_many, get_job
from outboxq.errors import InvalidPayload
from outboxq.queue.enqueue import payload_json
from outboxq.registry import Registry
from outboxq.workers.registry import Consumer


class Colour(enum.Enum):
    RED = 1


class Size(enum.IntEnum):
    BIG = 3


class Name(str):
    pass


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


# Payloads json.dumps accepts, with a reason to be here: orjson spells them differently, refuses them, or
# they are not plain JSON types (json.dumps writes them then).
ACCEPTED = [
    {"i": 1},
    "é ç 😀 \u2028 \x01 \x7f",  # orjson writes UTF-8 (and raw U+007F) where json.dumps escapes
    {"quote": '"', "backslash": "\\", "tab": "\t", "newline": "\n", "cr": "\r"},  # COPY's escapes too
    [2**63 - 1, -(2**63), 2**64 - 1],  # the edges of orjson's integers
    [2**64, -(2**63) - 1, 10**40],  # beyond them: orjson refuses, json.dumps writes
    [1e16, 1.5e300, 5e-324, -0.0, 0.1 + 0.2, 1.0],  # 1e16 / 1e+16: one jsonb value
    (1, "a", None, True, False),
    _nested(300),  # deeper than orjson goes (254 levels)
    {7: "int key", True: "bool key", None: "null key", 2.5: "float key"},  # json.dumps makes them strings
    [Size.BIG, Name("subclass of str"), {"k": Size.BIG}],
    "lone surrogate \ud800",  # json.dumps writes it (the server refuses it); orjson refuses it
    None,
    [],
    {},
]

# Payloads json.dumps refuses: enqueue must refuse them before anything is written, whatever orjson would do.
REFUSED = [
    float("nan"),
    {"x": [1, float("inf")]},
    [float("-inf")],
    uuid.UUID(int=1),  # orjson would write a string
    Colour.RED,  # orjson would write 1
    {"when": datetime(2026, 1, 1, tzinfo=UTC)},
    {"amount": Decimal("1.5")},
    {1, 2},
    b"bytes",
    object(),
]


@pytest.mark.parametrize("payload", ACCEPTED)
def test_payload_json_means_what_json_dumps_writes(payload):
    assert json.loads(payload_json(payload)) == json.loads(json.dumps(payload, separators=(",", ":")))


@pytest.mark.parametrize("payload", REFUSED, ids=lambda p: "object()" if type(p) is object else repr(p))
def test_payload_json_refuses_what_json_dumps_refuses(payload):
    with pytest.raises((TypeError, ValueError)):
        json.dumps(payload, allow_nan=False)
    with pytest.raises(InvalidPayload, match="not JSON"):
        payload_json(payload)


def test_circular_payloads_are_refused_as_json_dumps_refuses_them():
    loop: list = []
    loop.append(loop)
    cycle: dict = {}
    cycle["self"] = {"up": cycle}
    for payload in (loop, cycle):
        with pytest.raises(InvalidPayload, match="Circular reference"):
            payload_json(payload)


def test_stored_payloads_are_json_dumps_values_on_every_path(conn):
    """The jsonb stored equals json.dumps' text read as jsonb: by COPY, by the keyed INSERT, by enqueue."""
    storable = [p for p in ACCEPTED if not (isinstance(p, str) and "\ud800" in p)]
    copied = enqueue_many(conn, "json", storable)
    keyed = enqueue_many(conn, "json", storable, keys=[f"k{i}" for i in range(len(storable))])
    single = [enqueue(conn, "json", p) for p in storable]
    for jobs in (copied, keyed, single):
        for job, payload in zip(jobs, storable, strict=True):
            same = conn.execute("SELECT payload = %s::jsonb AS same FROM outboxq_jobs WHERE id = %s",
                                (json.dumps(payload, separators=(",", ":")), job.id)).fetchone()["same"]
            assert same, payload
            assert job.payload is payload  # the caller's object comes back, not a decoded copy


def test_a_refused_payload_anywhere_in_a_batch_writes_nothing(conn):
    enqueue(conn, "json", {"before": True})
    for bad in (float("nan"), uuid.UUID(int=1), Colour.RED):
        with pytest.raises(InvalidPayload):
            enqueue_many(conn, "json", [{"i": 1}, {"nested": [bad]}, {"i": 3}])
        with pytest.raises(InvalidPayload):
            enqueue(conn, "json", {"nested": [bad]})
    assert conn.execute("SELECT count(*) AS n FROM outboxq_jobs").fetchone()["n"] == 1


@pytest.mark.parametrize("mode", ["transaction", "autocommit", "autocommit_block"])
def test_copied_jobs_are_returned_as_stored_in_and_out_of_a_transaction(db_url, mode):
    """COPY leaves run_at and created_at to the column defaults only when it shares the transaction that read
    the clock with the ids; on an autocommit connection it sends them, so the returned jobs still match."""
    with psycopg.connect(db_url, row_factory=dict_row, autocommit=mode != "transaction") as conn:
        if mode == "autocommit_block":
            with conn.transaction():
                jobs = enqueue_many(conn, "clock", [{"i": i} for i in range(3)])
        else:
            jobs = enqueue_many(conn, "clock", [{"i": i} for i in range(3)])
            conn.commit()
        for job in jobs:
            stored = get_job(conn, job.id)
            assert stored == job


def test_copied_jobs_carry_every_option_that_is_not_a_default(db_url):
    """Each optional column of the COPY: a codec's bytes, priority, run_at, max_attempts, limit keys."""
    registry = Registry()
    registry.add_consumer(Consumer("coded", lambda p: None, encode=lambda p: f"<{p}>"))
    registry.add_consumer(Consumer("plain", lambda p: None))
    run_at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        coded = enqueue_many(conn, "coded", ["a", "b"], priority=-2, run_at=run_at, max_attempts=7,
                             limit_keys=["x", None], registry=registry)
        plain = enqueue_many(conn, "plain", [{"n": 1}], delay=60, registry=registry)
        conn.commit()
        rows = {r["id"]: r for r in conn.execute(
            "SELECT id, payload, payload_bytes, priority, run_at, max_attempts, limit_key, created_at, status "
            "FROM outboxq_jobs").fetchall()}
    assert [(bytes(rows[j.id]["payload_bytes"]), rows[j.id]["payload"]) for j in coded] == [(b"<a>", None),
                                                                                           (b"<b>", None)]
    assert [(rows[j.id]["priority"], rows[j.id]["run_at"], rows[j.id]["max_attempts"], rows[j.id]["limit_key"])
            for j in coded] == [(-2, run_at, 7, "x"), (-2, run_at, 7, None)]
    assert [(j.priority, j.run_at, j.max_attempts) for j in coded] == [(-2, run_at, 7)] * 2
    row = rows[plain[0].id]
    assert (row["payload"], row["payload_bytes"], row["priority"], row["limit_key"], row["status"]) == (
        {"n": 1}, None, 0, None, "queued")
    assert row["run_at"] - row["created_at"] == timedelta(seconds=60)
    assert (plain[0].run_at, plain[0].created_at) == (row["run_at"], row["created_at"])


def test_copied_jobs_are_ordinary_frozen_jobs(conn):
    """enqueue_many builds its jobs as unfrozen drafts made Jobs: nothing of the draft may show."""
    from dataclasses import FrozenInstanceError

    from outboxq.queue.jobs import Job

    job = enqueue_many(conn, "json", ["hashable"])[0]
    assert type(job) is Job and isinstance(job, Job)
    with pytest.raises(FrozenInstanceError):
        job.id = 5  # type: ignore[misc]
    assert hash(job) == hash(get_job(conn, job.id)) and job == get_job(conn, job.id)
    assert repr(job).startswith("Job(id=")
