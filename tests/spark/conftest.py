"""One local Spark session per pytest process, shared by every Spark test module (a session takes seconds
to start, and a second one in the same process would only be the first one again: getOrCreate)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator:
    """A local[2] session with format("outboxq") registered, stopped when the pytest process ends."""
    from outboxq.spark_jobs import register
    from outboxq.spark_jobs.session import build_session

    session = build_session("local[2]", shuffle_partitions=2)
    register(session)
    yield session
    session.stop()
