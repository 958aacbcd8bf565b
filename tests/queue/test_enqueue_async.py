"""Async enqueue on a real PostgreSQL: psycopg AsyncConnection and SQLAlchemy AsyncSession / AsyncConnection.

The same contract as the sync calls: nothing commits; rollback leaves no job; commit makes it runnable (and
NOTIFYs); duplicate keys and unknown dependencies raise before anything is written.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from outboxq import (
    DuplicateJob,
    InvalidInput,
    JobStatus,
    UnknownDependency,
    consumer,
    enqueue_async,
    enqueue_many_async,
    get_job,
    get_job_async,
)
from outboxq.db import sqlalchemy_url
from outboxq.testing import TestQueue


def count_jobs(url: str) -> int:
    with psycopg.connect(url) as c:
        return c.execute("SELECT count(*) FROM outboxq_jobs").fetchone()[0]


def test_psycopg_async_commit_rollback_and_notify(db_url):
    async def scenario():
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
            await listener.execute("LISTEN outboxq_jobs")
            async with await psycopg.AsyncConnection.connect(db_url) as conn:
                rolled = await enqueue_async(conn, "emails", {"to": "ann"}, key="ann")
                assert rolled.id > 0 and rolled.status is JobStatus.QUEUED
                await conn.rollback()
                assert count_jobs(db_url) == 0
                job = await enqueue_async(conn, "emails", {"to": "ann"}, key="ann")
                assert await get_job_async(conn, job.id) is not None  # visible inside its transaction
                await conn.commit()
            notify = await anext(listener.notifies(timeout=5))
            return job, notify

    job, notify = asyncio.run(scenario())
    assert notify.payload == "emails"
    with psycopg.connect(db_url) as c:
        stored = get_job(c, job.id)
    assert stored.status is JobStatus.QUEUED and stored.payload == {"to": "ann"} and stored.key == "ann"


def test_sqlalchemy_async_session_and_connection(db_url):
    async def scenario():
        engine = create_async_engine(sqlalchemy_url(db_url))
        try:
            async with AsyncSession(engine) as session:
                await session.execute(sqlalchemy.text("CREATE TABLE orders (id int PRIMARY KEY)"))
                await session.execute(sqlalchemy.text("INSERT INTO orders VALUES (1)"))
                await enqueue_async(session, "emails", {"order": 1}, key="order-1")
                await session.rollback()
            assert count_jobs(db_url) == 0
            async with AsyncSession(engine) as session:
                await session.execute(sqlalchemy.text("CREATE TABLE orders (id int PRIMARY KEY)"))
                await session.execute(sqlalchemy.text("INSERT INTO orders VALUES (1)"))
                first = await enqueue_async(session, "emails", {"order": 1}, key="order-1")
                await session.commit()
            async with engine.connect() as connection:
                many = await enqueue_many_async(connection, "emails", [{"n": i} for i in range(3)])
                keyed = await enqueue_many_async(connection, "emails", [1, 2], keys=["k1", "k2"])
                await connection.commit()
            return first, many, keyed
        finally:
            await engine.dispose()

    first, many, keyed = asyncio.run(scenario())
    assert count_jobs(db_url) == 6
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
        assert get_job(c, first.id).key == "order-1"
        assert [get_job(c, j.id).payload for j in many] == [{"n": 0}, {"n": 1}, {"n": 2}]
        assert [get_job(c, j.id).key for j in keyed] == ["k1", "k2"]


def test_async_duplicate_key_and_unknown_dependency_write_nothing(db_url):
    async def scenario():
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            await enqueue_async(conn, "emails", 1, key="dup")
            await conn.commit()
            with pytest.raises(DuplicateJob):
                await enqueue_async(conn, "emails", 2, key="dup")
            await conn.rollback()
            with pytest.raises(DuplicateJob):
                await enqueue_many_async(conn, "emails", [3, 4], keys=["fresh", "dup"])
            await conn.commit()  # the batch undid its own rows: nothing of it is left to commit
            with pytest.raises(UnknownDependency) as missing:
                await enqueue_async(conn, "invoices", 5, depends_on=[("emails", "nope")])
            await conn.commit()
            return missing.value

    missing = asyncio.run(scenario())
    assert missing.missing == [("emails", "nope")]
    assert count_jobs(db_url) == 1


RAN: list[int] = []


@consumer("async-deps")
def record_run(payload, ctx):
    """This module's handler: records which jobs ran, in order."""
    RAN.append(ctx.job_id)


def test_async_dependency_waits_and_the_committed_job_runs_once(db_url):
    async def scenario():
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            first = await enqueue_async(conn, "async-deps", "a", key="a")
            second = await enqueue_async(conn, "async-deps", "b", depends_on=[("async-deps", "a")])
            await conn.commit()
            return first, second

    first, second = asyncio.run(scenario())
    assert second.status is JobStatus.WAITING
    RAN.clear()
    assert TestQueue(db_url).drain("async-deps") == 2
    assert RAN == [first.id, second.id]


def test_async_calls_refuse_sync_connections_with_a_clear_error(db_url):
    async def scenario():
        with psycopg.connect(db_url) as sync_conn:
            with pytest.raises(InvalidInput, match="use enqueue\\(\\) for sync connections"):
                await enqueue_async(sync_conn, "emails", 1)
        with pytest.raises(InvalidInput, match="queue name"):
            await enqueue_async(None, "bad queue!", 1)  # validation comes before any connection use

    asyncio.run(scenario())
