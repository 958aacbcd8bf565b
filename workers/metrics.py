"""A worker's own Prometheus metrics (prometheus-client), served by `outboxq worker --metrics-port PORT`.

Counted in the process, as handlers run, so a scrape costs no database work: handler runs started and
finished by queue and outcome, handler durations, and the jobs this worker holds.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from outboxq.workers.executor import ClaimedJob, Outcome

DURATION_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def outcome_label(outcome: Outcome) -> str:
    """succeeded, failed, timed_out, cancelled or fenced: what the handler run came to."""
    if outcome.fenced:
        return "fenced"
    if outcome.cancelled:
        return "cancelled"
    if outcome.succeeded:
        return "succeeded"
    if outcome.error and "timed out" in outcome.error:
        return "timed_out"
    return "failed"


class WorkerMetrics:
    """The metrics of one worker, in a registry of their own (several workers may share a process in tests)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.started = Counter("outboxq_worker_jobs_started", "Handler runs started, by queue",
                               ["queue"], registry=self.registry)
        self.finished = Counter("outboxq_worker_jobs_finished", "Handler runs finished, by queue and outcome",
                                ["queue", "outcome"], registry=self.registry)
        self.duration = Histogram("outboxq_worker_handler_duration_seconds", "Handler run time, by queue",
                                  ["queue"], buckets=DURATION_BUCKETS_S, registry=self.registry)
        self.in_flight = Gauge("outboxq_worker_jobs_in_flight", "Jobs this worker holds the lease of",
                               registry=self.registry)

    def job_started(self, job: ClaimedJob) -> None:
        """Count a handler run that starts."""
        self.started.labels(job.queue).inc()

    def job_finished(self, outcome: Outcome) -> None:
        """Count a handler run that ended, and its duration."""
        self.finished.labels(outcome.job.queue, outcome_label(outcome)).inc()
        self.duration.labels(outcome.job.queue).observe(outcome.duration_s)

    def track_in_flight(self, read: Callable[[], int]) -> None:
        """Read the in-flight count at each scrape."""
        self.in_flight.set_function(read)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve /metrics on host:port from a daemon thread (0 picks a free port: see `port`)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = server.server_port
