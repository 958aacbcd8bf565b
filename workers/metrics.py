"""A worker's own Prometheus metrics, served by `outboxq worker --metrics-port PORT` (prometheus-client).

Counted in the process, so a scrape costs no database work: handler runs started and finished by queue and
outcome, handler durations, and the jobs this worker holds. The counting is kept off the hot path's cost:
a handler thread adds one to a plain counter under a lock, the completer thread records a whole batch of
outcomes at once, and prometheus-client builds the families only when scraped (a custom collector). A
handler thread counts its starts in a counter of its own: no lock on the handler's path.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from outboxq.workers.executor import ClaimedJob, Outcome

DURATION_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class WorkerMetrics:
    """The metrics of one worker, in a registry of their own (several workers may share a process in tests)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # One started-counter per handler thread (only that thread writes it; a scrape adds them up).
        self._local = threading.local()
        self._started_by_thread: list[dict[str, int]] = []
        self._finished: dict[tuple[str, str], int] = defaultdict(int)
        # queue -> [count per bucket (the last one is +Inf), sum of seconds]
        self._durations: dict[str, list[float]] = {}
        self._in_flight: Callable[[], int] = lambda: 0
        self.registry = CollectorRegistry()
        self.registry.register(self)
        self.host: str | None = None
        self.port: int | None = None

    def job_started(self, job: ClaimedJob) -> None:
        """Count a handler run that starts (called on the handler's thread)."""
        counts = getattr(self._local, "started", None)
        if counts is None:
            counts = self._local.started = defaultdict(int)
            with self._lock:
                self._started_by_thread.append(counts)
        counts[job.queue] += 1

    def jobs_finished(self, outcomes: Iterable[Outcome]) -> None:
        """Count handler runs that ended, and their durations (called once per written batch)."""
        with self._lock:
            for outcome in outcomes:
                queue = outcome.job.queue
                self._finished[(queue, outcome.label)] += 1
                histogram = self._durations.get(queue)
                if histogram is None:
                    histogram = self._durations[queue] = [0.0] * (len(DURATION_BUCKETS_S) + 2)
                histogram[bisect_left(DURATION_BUCKETS_S, outcome.duration_s)] += 1
                histogram[-1] += outcome.duration_s

    def track_in_flight(self, read: Callable[[], int]) -> None:
        """Read the in-flight count at each scrape."""
        self._in_flight = read

    def collect(self) -> Iterator[Metric]:
        """The metric families, built at scrape time (the prometheus-client collector protocol)."""
        with self._lock:
            started: dict[str, int] = defaultdict(int)
            for counts in self._started_by_thread:
                for queue, n in list(counts.items()):
                    started[queue] += n
            finished = dict(self._finished)
            durations = {q: list(h) for q, h in self._durations.items()}
        family = CounterMetricFamily("outboxq_worker_jobs_started", "Handler runs started, by queue",
                                     labels=["queue"])
        for queue, n in sorted(started.items()):
            family.add_metric([queue], n)
        yield family
        family = CounterMetricFamily("outboxq_worker_jobs_finished", "Handler runs finished, by queue and outcome",
                                     labels=["queue", "outcome"])
        for (queue, outcome), n in sorted(finished.items()):
            family.add_metric([queue, outcome], n)
        yield family
        histogram = HistogramMetricFamily("outboxq_worker_handler_duration_seconds", "Handler run time, by queue",
                                          labels=["queue"])
        for queue, histogram_counts in sorted(durations.items()):
            cumulative, buckets = 0.0, []
            for bound, in_bucket in zip([*map(str, DURATION_BUCKETS_S), "+Inf"], histogram_counts[:-1], strict=True):
                cumulative += in_bucket
                buckets.append((bound, cumulative))
            histogram.add_metric([queue], buckets, histogram_counts[-1])
        yield histogram
        yield GaugeMetricFamily("outboxq_worker_jobs_in_flight", "Jobs this worker holds the lease of",
                                value=self._in_flight())

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve /metrics on host:port from a daemon thread (0 picks a free port, then in `port`; the address
        it listens on in `host`)."""
        # The loopback interface by default (prometheus-client's own default is every interface): the endpoint
        # has no authentication, and its series name the queues and their load.
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self.host, self.port = str(server.server_address[0]), server.server_port
