"""OpenTelemetry tracing (the `otel` extra): a job's trace continues from the code that enqueued it.

At enqueue, when a span is active, a short PRODUCER span `outboxq.enqueue <queue>` is recorded and its W3C
trace context (`traceparent`, `tracestate`) stored in the job's captured context. Each attempt then runs in a
CONSUMER span `outboxq.consume <queue>` whose parent is that enqueue span, with the queue, job id, attempt and
outcome as attributes. With opentelemetry not installed, or no tracer provider configured (the default
proxy), every function here returns at once: the hot paths pay nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.propagate import extract, inject
    from opentelemetry.trace import ProxyTracerProvider, SpanKind, Status, StatusCode
except ImportError:  # the otel extra is not installed
    trace = None  # type: ignore[assignment]

TRACER_NAME = "outboxq"


def enabled() -> bool:
    """True when opentelemetry is installed and the application configured a tracer provider."""
    return trace is not None and not isinstance(trace.get_tracer_provider(), ProxyTracerProvider)


def enqueue_carrier(queue: str) -> dict[str, str] | None:
    """Inside an active span: record an enqueue span and return its trace context to store with the job."""
    if not enabled() or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(f"outboxq.enqueue {queue}", kind=SpanKind.PRODUCER,
                                      attributes={"messaging.system": "outboxq",
                                                  "messaging.destination.name": queue}):
        inject(carrier)
    return carrier or None


@contextmanager
def consumer_span(queue: str, job_id: int, attempt: int, captured: dict[str, Any] | None) -> Iterator[Any]:
    """The span of one attempt, continuing the enqueuer's trace; yields the span (None when not tracing).

    The caller sets the outcome with `set_outcome(span, ...)` before the block ends."""
    if not enabled():
        yield None
        return
    parent = extract({k: v for k, v in (captured or {}).items() if k in ("traceparent", "tracestate")})
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(
            f"outboxq.consume {queue}", context=parent, kind=SpanKind.CONSUMER, record_exception=False,
            set_status_on_exception=False,
            attributes={"messaging.system": "outboxq", "messaging.destination.name": queue,
                        "outboxq.job.id": job_id, "outboxq.job.attempt": attempt}) as span:
        yield span


def set_outcome(span: Any, outcome: str, error: str | None = None) -> None:
    """Record what the attempt came to on its span (a no-op without one)."""
    if span is None:
        return
    span.set_attribute("outboxq.job.outcome", outcome)
    if error is not None and outcome not in ("succeeded", "snoozed"):
        span.set_status(Status(StatusCode.ERROR, error[:500]))


def instrument_app(app: Any) -> None:
    """Make the API's requests spans, when opentelemetry-instrumentation-fastapi is installed and a tracer
    provider is configured before the app is created (`opentelemetry-instrument` does that).

    Without a provider the middleware's spans record nothing but still cost: about a sixth of a large batch
    request's own route time. The spans of each ASGI receive and send are left out: a large
    body arrives in many messages, each a span, and the request's span says what they would."""
    if not enabled():
        return
    try:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    except ImportError:
        return
    FastAPIInstrumentor.instrument_app(app, exclude_spans=["receive", "send"])
