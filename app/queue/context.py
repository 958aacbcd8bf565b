"""Context propagation: context variables named in settings are captured at enqueue and restored around the handler."""

from __future__ import annotations

import contextvars
import importlib
import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from outboxq import tracing

_UNSET = object()
_resolved: tuple[tuple[str, contextvars.ContextVar], ...] | None = None


def configure(names: list[str] | None = None) -> None:
    """Resolve the "module:attribute" names of the ContextVars to capture (settings.context_vars by default)."""
    global _resolved
    if names is None:
        from outboxq.settings import get_settings

        names = get_settings().context_vars
    resolved = []
    for name in names:
        module_name, _, attribute = name.partition(":")
        var = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(var, contextvars.ContextVar):
            raise TypeError(f"{name} is not a contextvars.ContextVar")
        resolved.append((name, var))
    _resolved = tuple(resolved)


def _variables() -> tuple[tuple[str, contextvars.ContextVar], ...]:
    if _resolved is None:
        configure()
    assert _resolved is not None
    return _resolved


def capture(queue: str | None = None) -> str | None:
    """The set values of the configured context variables, and (when tracing) the W3C trace context of an
    enqueue span for `queue`, as JSON text; None when there is nothing to keep."""
    values = {}
    for name, var in _variables():
        value = var.get(_UNSET)
        if value is not _UNSET:
            values[name] = value
    if queue is not None:
        carrier = tracing.enqueue_carrier(queue)  # keys "traceparent"/"tracestate": never a "module:name"
        if carrier:
            values.update(carrier)
    return json.dumps(values, default=str) if values else None


# What restored() returns for a job that captured nothing (most jobs): a generator's context manager, entered and
# left around every handler run, was a large part of a short job's own overhead.
_NOTHING_TO_RESTORE = nullcontext()


def restored(values: dict[str, Any] | None) -> AbstractContextManager[None]:
    """Set the captured variables for the duration of the block (in the current context)."""
    return _restoring(values) if values else _NOTHING_TO_RESTORE


@contextmanager
def _restoring(values: dict[str, Any]) -> Iterator[None]:
    by_name = dict(_variables())
    tokens = []
    for name, value in values.items():
        var = by_name.get(name)
        if var is not None:
            tokens.append((var, var.set(value)))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)
