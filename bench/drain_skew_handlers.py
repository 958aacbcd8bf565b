"""The no-op handler of bench/drain_skew.py (`outboxq worker --handlers drain_skew_handlers`, from bench/)."""

from outboxq.workers import consumer


@consumer("skew")
def noop(payload: object) -> None:
    """Do nothing: the drain measures the queue, not the work."""
