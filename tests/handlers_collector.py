"""A handler that reports the cycle collector's settings of the worker process running it (imported with
`outboxq worker --handlers tests.handlers_collector`)."""

from __future__ import annotations

import gc

from outboxq.workers import JobContext, consumer


@consumer("collector")
def collector(payload: dict, ctx: JobContext) -> dict:
    """The cycle collector's settings in this worker process, as the job's result."""
    return {"young_threshold": gc.get_threshold()[0], "frozen": gc.get_freeze_count()}
