"""@consumer: register a handler for a queue, with its retry, lease and payload options."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from outboxq.errors import InvalidInput
from outboxq.queue.backoff import RetryPolicy
from outboxq.queue.enqueue import validate_queue_name
from outboxq.queue.limits import QueueLimits, declared_limits
from outboxq.registry import Registry, default_registry
from outboxq.settings import Settings, get_settings


@dataclass(frozen=True)
class Consumer:
    """A handler and its options. Options left as None take the settings' defaults when the worker starts."""

    queue: str
    handler: Callable[..., Any]
    max_attempts: int | None = None
    backoff_base: float | None = None
    backoff_max: float | None = None
    jitter: float | None = None
    lease_s: float | None = None
    max_execute_s: float | None = None
    timeout: float | None = None  # seconds an attempt may run before it is failed (and stopped or fenced)
    idempotent_conflicts: bool = False
    valid_payload: Callable[[Any], bool] | None = None
    encode: Callable[[Any], bytes | str] | None = None
    decode: Callable[[bytes], Any] | None = None
    depends_on: Callable[[Any], Iterable[tuple[str, str]]] | None = None
    consumer_id: str | None = None
    # Flow control (outboxq.queue.limits): at most N running (per limit key with limit_by), N starts per period.
    global_concurrency: int | None = None
    rate_limit: str | None = None
    limit_by: str | Callable[[Any], Any] | None = None

    # Cached: the executor asks for every job, and inspect.signature costs more than a no-op handler.
    @cached_property
    def is_async(self) -> bool:
        """True when the handler is a coroutine function."""
        return inspect.iscoroutinefunction(self.handler)

    @cached_property
    def takes_context(self) -> bool:
        """True when the handler accepts (payload, ctx) rather than (payload)."""
        try:
            params = inspect.signature(self.handler).parameters.values()
        except (TypeError, ValueError):
            return True
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)

    @property
    def id(self) -> str:
        """The consumer id that delivery hashes are made from (the handler's qualified name by default)."""
        return self.consumer_id or f"{self.queue}:{self.handler.__module__}.{self.handler.__qualname__}"

    def retry_policy(self, settings: Settings | None = None) -> RetryPolicy:
        """The consumer's retry policy, with the settings' defaults for what it leaves unset."""
        return RetryPolicy.from_settings(settings or get_settings(), max_attempts=self.max_attempts,
                                         backoff_base=self.backoff_base, backoff_max=self.backoff_max,
                                         jitter=self.jitter)

    @cached_property
    def limits(self) -> QueueLimits:
        """The flow-control limits this consumer declares for its queue."""
        return declared_limits(self.queue, global_concurrency=self.global_concurrency,
                               rate_limit=self.rate_limit, limit_by=self.limit_by)

    def effective_lease_s(self, settings: Settings | None = None) -> float:
        """Seconds a claim holds the job before another worker may rescue it (renewed while running)."""
        return (settings or get_settings()).lease_s if self.lease_s is None else self.lease_s

    def effective_timeout_s(self, settings: Settings | None = None) -> float | None:
        """Seconds an attempt may run before it fails as timed out (None: no limit)."""
        return (settings or get_settings()).job_timeout_s if self.timeout is None else self.timeout

    def effective_max_execute_s(self, settings: Settings | None = None) -> float:
        """Seconds after which a running handler's stack is logged as stuck."""
        return (settings or get_settings()).max_execute_s if self.max_execute_s is None else self.max_execute_s


def register(c: Consumer, registry: Registry | None = None) -> Consumer:
    """Check a consumer's options and add it (replacing any earlier one for the same queue), with its payload
    hooks for enqueue, to `registry` (the default registry unless given)."""
    validate_queue_name(c.queue)
    if c.max_attempts is not None and c.max_attempts < 0:
        raise InvalidInput("max_attempts must be >= 0 (0 means retry forever)")
    if c.timeout is not None and (isinstance(c.timeout, bool) or not isinstance(c.timeout, int | float)
                                  or not 0 < c.timeout < float("inf")):
        raise InvalidInput(f"consumer of {c.queue!r}: timeout must be a number of seconds > 0, not {c.timeout!r}")
    if (c.encode is None) != (c.decode is None):
        raise InvalidInput(f"consumer of {c.queue!r}: give both encode and decode, or neither")
    c.limits  # noqa: B018 - validates the flow-control options now rather than at the worker's start
    (registry or default_registry).add_consumer(c)
    return c


def consumer(queue: str, *, registry: Registry | None = None,
             **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: `@consumer("emails", max_attempts=25)` makes the function the handler of `emails`.

    The handler is `def handle(payload, ctx)` (or `async def`); returning is success, raising is a failed
    attempt. Options: max_attempts, backoff_base, backoff_max, jitter, lease_s, max_execute_s, timeout,
    idempotent_conflicts, valid_payload, encode/decode, depends_on, consumer_id; flow control:
    global_concurrency (at most N running across every worker), rate_limit ("N/s", "N/m", "N/h": at most N
    starts per period), limit_by (a payload field or a callable payload -> str: the limits apply per key).
    The consumer goes to `registry` (outboxq.registry.default_registry unless given).
    """

    def decorate(handler: Callable[..., Any]) -> Callable[..., Any]:
        register(Consumer(queue=queue, handler=handler, **options), registry)
        return handler

    return decorate


def get_consumer(queue: str) -> Consumer | None:
    """The consumer of `queue` in the default registry, if any."""
    return default_registry.consumer(queue)


def all_consumers() -> list[Consumer]:
    """Every consumer of the default registry."""
    return default_registry.consumers()


def load_handler_modules(modules: Iterable[str]) -> list[Consumer]:
    """Import the named modules (their @consumer decorators register handlers) and return the consumers."""
    for name in modules:
        name = name.strip()
        if name:
            importlib.import_module(name)
    loaded = all_consumers()
    if not loaded:
        raise InvalidInput(f"no @consumer found in {', '.join(modules)}")
    return loaded
