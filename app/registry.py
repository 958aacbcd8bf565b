"""The registry: each queue's consumer, the payload hooks enqueue applies for it, and the periodic schedules.

A worker runs the consumers and schedules of the registry it is given, and enqueue validates, encodes and
keys payloads with the hooks of the registry it is given; both default to `default_registry`, which the
`@consumer` decorator and `periodic()` fill at import of a handler module. A separate Registry keeps two sets
of handlers in one process apart (an embedding application's, a test's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outboxq.workers.periodic import Schedule
    from outboxq.workers.registry import Consumer


@dataclass(frozen=True, slots=True)
class PayloadHooks:
    """What enqueue applies to a queue's payloads: its consumer's codec, validation, dependencies, limit key."""

    encode: Callable[[Any], bytes | str] | None = None
    valid_payload: Callable[[Any], bool] | None = None
    depends_on: Callable[[Any], Iterable[Sequence[str]]] | None = None
    limit_by: str | Callable[[Any], Any] | None = None  # flow control: the job's limit key (outboxq.queue.limits)


class Registry:
    """Consumers by queue (with their payload hooks) and periodic schedules by name."""

    def __init__(self) -> None:
        self._consumers: dict[str, Consumer] = {}
        self._hooks: dict[str, PayloadHooks] = {}
        self._schedules: dict[str, Schedule] = {}

    def add_consumer(self, consumer: Consumer) -> None:
        """Add a consumer, replacing any earlier one of its queue, and its payload hooks."""
        self._consumers[consumer.queue] = consumer
        self._hooks[consumer.queue] = PayloadHooks(consumer.encode, consumer.valid_payload, consumer.depends_on,
                                                   consumer.limit_by)

    def consumer(self, queue: str) -> Consumer | None:
        """The consumer of `queue`, if any."""
        return self._consumers.get(queue)

    def consumers(self) -> list[Consumer]:
        """Every consumer, in the order they were added."""
        return list(self._consumers.values())

    def payload_hooks(self, queue: str) -> PayloadHooks | None:
        """The payload hooks of `queue`'s consumer, if it has one."""
        return self._hooks.get(queue)

    def add_schedule(self, schedule: Schedule) -> None:
        """Add a periodic schedule, replacing any earlier one of its name."""
        self._schedules[schedule.name] = schedule

    def schedules(self) -> list[Schedule]:
        """Every periodic schedule."""
        return list(self._schedules.values())

    def copy(self) -> Registry:
        """A registry with the same entries (for a test to restore afterwards)."""
        other = Registry()
        other._consumers, other._hooks, other._schedules = (dict(self._consumers), dict(self._hooks),
                                                            dict(self._schedules))
        return other

    def restore(self, saved: Registry) -> None:
        """Make this registry's entries those of `saved` again (see copy())."""
        self._consumers, self._hooks, self._schedules = (dict(saved._consumers), dict(saved._hooks),
                                                         dict(saved._schedules))


default_registry = Registry()
