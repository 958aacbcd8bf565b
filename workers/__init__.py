"""Running jobs: @consumer handlers, the worker, and test helpers."""

from outboxq.workers.context import JobContext
from outboxq.workers.registry import Consumer, consumer

__all__ = ["Consumer", "JobContext", "consumer", "Worker"]


def __getattr__(name: str):
    if name == "Worker":  # imported lazily: `from outboxq.workers import consumer` stays light
        from outboxq.workers.runner import Worker

        return Worker
    raise AttributeError(name)
