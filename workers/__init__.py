"""Running jobs: @consumer handlers, the worker, and test helpers."""

from workers.context import JobContext
from workers.registry import Consumer, consumer

__all__ = ["Consumer", "JobContext", "consumer", "Worker"]


def __getattr__(name: str):
    if name == "Worker":  # imported lazily: `from workers import consumer` stays light
        from workers.runner import Worker

        return Worker
    raise AttributeError(name)
