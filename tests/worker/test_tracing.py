"""OpenTelemetry: one job followed from the HTTP request that enqueued it to the handler that ran it."""

from __future__ import annotations

import asyncio

import psycopg
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from outboxq import enqueue, get_job
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker
from tests.api_support import api_client
from tests.support import status_of, wait_for

EXPORTER = InMemorySpanExporter()


def _tracer_provider() -> None:
    """The process's tracer provider (set once: OpenTelemetry refuses to replace it)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)


def test_a_job_is_traced_from_the_http_request_to_its_handler(db_url):
    _tracer_provider()
    EXPORTER.clear()
    seen_in_handler = []

    def handler(payload, ctx):
        seen_in_handler.append(trace.get_current_span().get_span_context().trace_id)
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    with api_client(db_url, scope="enqueue") as api:
        response = api.post("/v1/queues/traced/jobs", json={"payload": {"n": 1}})
        assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    worker = Worker([Consumer("traced", handler, backoff_base=0.1, jitter=0.0)], url=db_url, poll_interval=0.05,
                    run_maintenance=False).start()
    try:
        wait_for(lambda: status_of(db_url, job_id) == "done")
    finally:
        worker.stop(timeout=5)

    spans = EXPORTER.get_finished_spans()
    server = [s for s in spans if s.kind is SpanKind.SERVER and "/v1/queues/" in s.name]
    enqueue_span = next(s for s in spans if s.name == "outboxq.enqueue traced")
    consumes = sorted((s for s in spans if s.name == "outboxq.consume traced"),
                      key=lambda s: s.attributes["outboxq.job.attempt"])
    assert server, [s.name for s in spans]
    trace_id = server[0].context.trace_id
    assert enqueue_span.context.trace_id == trace_id and enqueue_span.kind is SpanKind.PRODUCER
    assert [s.context.trace_id for s in consumes] == [trace_id, trace_id]
    assert all(s.parent.span_id == enqueue_span.context.span_id for s in consumes)
    assert [(s.attributes["outboxq.job.id"], s.attributes["outboxq.job.attempt"],
             s.attributes["outboxq.job.outcome"]) for s in consumes] == [(job_id, 1, "failed"), (job_id, 2, "succeeded")]
    assert consumes[0].attributes["messaging.destination.name"] == "traced"
    assert seen_in_handler == [trace_id, trace_id]  # the handler's own spans join the trace
    with psycopg.connect(db_url) as c:
        assert get_job(c, job_id).context["traceparent"].split("-")[1] == format(trace_id, "032x")


def test_an_async_handlers_own_spans_are_children_of_its_consume_span(db_url):
    _tracer_provider()
    EXPORTER.clear()
    tracer = trace.get_tracer("tests")

    async def handler(payload, ctx):
        with tracer.start_as_current_span("inside the async handler"):
            await asyncio.sleep(0)

    with psycopg.connect(db_url) as conn:
        job = enqueue(conn, "traced-async", {"n": 1})
        conn.commit()
    worker = Worker([Consumer("traced-async", handler)], url=db_url, poll_interval=0.05,
                    run_maintenance=False).start()
    try:
        wait_for(lambda: status_of(db_url, job.id) == "done")
    finally:
        worker.stop(timeout=5)
    spans = EXPORTER.get_finished_spans()
    consume = next(s for s in spans if s.name == "outboxq.consume traced-async")
    inner = next(s for s in spans if s.name == "inside the async handler")
    assert inner.parent is not None and inner.parent.span_id == consume.context.span_id
    assert inner.context.trace_id == consume.context.trace_id


def test_the_api_is_instrumented_only_when_a_tracer_provider_is_configured():
    """Without a provider the request middleware would cost time and record nothing. (In a fresh process: the
    tracer provider of this one may already be set by the tests above.)"""
    import subprocess
    import sys

    program = """
import sys
from opentelemetry import trace
if sys.argv[1] == "with":
    from opentelemetry.sdk.trace import TracerProvider
    trace.set_tracer_provider(TracerProvider())
from outboxq.api import create_app
from outboxq.settings import Settings
app = create_app(Settings(database_url="postgresql://nobody@127.0.0.1:1/none", api_tokens="x" * 20 + ":admin"))
print(getattr(app, "_is_instrumented_by_opentelemetry", False))
"""
    seen = {case: subprocess.run([sys.executable, "-c", program, case], capture_output=True, text=True, timeout=60)
            for case in ("with", "without")}
    assert {case: r.stdout.strip() for case, r in seen.items()} == {"with": "True", "without": "False"}, seen
